"""The invariant strategy: fixed micro-shards summed along one fixed binary tree (each device its subtree, then an
all-gather and the same finish everywhere), bitwise alike on 1, 2, 4, ... devices; randomness by piece, not device."""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from jax import lax

from jaxdp.config import ConfigError, Layout
from jaxdp.strategies.base import DataAxis, EvalFn, Gradients, GradFn, PyTree, Strategy, is_float, micro_batches

DETERMINISTIC_GPU = "xla_gpu_deterministic_ops"  # XLA's name in jax 0.10.2 (also a flag: --xla_gpu_deterministic_ops).


class Invariant(Strategy):
  """Fixed micro-shards summed in a fixed order: the same bits on 1, 2, 4, ... devices."""
  flag = "invariant"
  title = "invariant mode"
  checked = False  # The step gathers and sums across devices itself.

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict, layout: Layout) -> None:
    """The fixed micro-shards (a power of two, shared by the devices) and what the mode cannot serve."""
    m, accum = config.parallel.invariant_shards, config.grad_accum_steps
    if not isinstance(m, int) or m < 1 or m & (m - 1):
      raise ConfigError(f"parallel.invariant_shards must be a power of two, got {m!r}")
    if m % layout.num_devices:  # Only a power of two divides one: the device count is a power of two too.
      raise ConfigError(f"parallel.invariant needs a power-of-two device count dividing invariant_shards ({m}), "
                        f"got {layout.num_devices} devices")
    if layout.global_batch % (m * accum):
      raise ConfigError(f"batch_size ({layout.global_batch}) must be divisible by parallel.invariant_shards ({m}) "
                        f"x grad_accum_steps ({accum})")
    if layout.eval_global_batch % m:
      raise ConfigError(f"eval batch size ({layout.eval_global_batch}) must be divisible by "
                        f"parallel.invariant_shards ({m}) in invariant mode")
    if config.parallel.shard_optimizer_state:
      raise ConfigError("parallel.invariant and parallel.shard_optimizer_state cannot be combined")
    if config.parallel.allreduce_dtype != "float32":  # Rounding subtree sums would depend on N.
      raise ConfigError(f"parallel.invariant gathers float32 subtree sums; parallel.allreduce_dtype="
                        f"{config.parallel.allreduce_dtype!r} would round them at points that depend on the "
                        f"device count")
    if config.model.get("bn_axis_name", None):  # Statistics over the devices' micro-shards at once depend on N.
      raise ConfigError(f"parallel.invariant cannot serve synchronized BatchNorm (model.bn_axis_name="
                        f"{config.model.bn_axis_name!r}); set model.bn_axis_name=None")

  @classmethod
  def compiler_options(cls, platform: str) -> dict[str, Any] | None:
    """On GPUs, XLA's deterministic ops (no atomics in scatters and reductions): per program, so they hold however
    late JAX started; the CLI also sets them in XLA_FLAGS (`runtime.process.deterministic_gpu`)."""
    return {DETERMINISTIC_GPU: True} if platform == "gpu" else None

  def gradients(self, grad_fn: GradFn, state: PyTree, batch: dict, rng: jax.Array, axis: DataAxis) -> Gradients:
    m, k = self.options.invariant_shards, self.options.accum_steps
    m_local = m // self.options.num_shards
    pieces = micro_batches(batch, m_local * k)
    first = lax.axis_index(axis.name) * m_local * k  # Global index of this device's first piece.

    def one(p: int, model_state: PyTree) -> tuple:
      piece, key = jax.tree.map(lambda x: x[p], pieces), jax.random.fold_in(rng, first + p)
      zero = 0.0 * jax.random.uniform(jax.random.fold_in(key, 1))  # 0, but no value XLA can fold or share.
      model_state = jax.tree.map(lambda x: x + zero.astype(x.dtype) if is_float(x) else x, model_state)
      (_, (metrics, model_state)), grads = grad_fn(state.params, model_state, piece, key)
      return metrics, model_state, grads

    # Unrolled, not a loop: XLA:CPU compiles a convolution in a loop differently, by a trip count that depends on N.
    outputs = []
    for p in range(m_local * k):
      # Every piece starts from the step's float state; integer state (a counter) runs on through a micro-shard.
      start = state.model_state if p % k == 0 else jax.tree.map(
          lambda mine, fresh: fresh if is_float(fresh) else mine, outputs[-1][1], state.model_state)
      outputs.append(one(p, start))
    per_piece = jax.tree.map(lambda *xs: jnp.stack(xs), *outputs)
    metrics, rest = per_piece[0], per_piece[1:]
    # Maxima combine by max (exact in any order); everything else is summed in the fixed order.
    maxima = {name: jnp.max(v) for name, v in metrics["max"].items()}
    summed = ({kind: metrics[kind] for kind in metrics if kind != "max"}, *rest)
    per_shard = jax.tree.map(lambda x: _shard_total(x.reshape(m_local, k, *x.shape[1:])), summed)
    subtree = jax.tree.map(_tree_total, per_shard)
    gathered, maxima = lax.all_gather(subtree, axis.name), {n: lax.pmax(v, axis.name) for n, v in maxima.items()}
    (sums, model_state, grads) = jax.tree.map(_tree_total, gathered)
    model_state = jax.tree.map(lambda x: x / (m * k) if is_float(x) else x, model_state)  # Float sums as means.
    return {**sums, "max": maxima}, model_state, grads

  def eval_sums(self, per_example: EvalFn, batch: dict, axis: DataAxis) -> dict[str, Any]:
    m_local = self.options.invariant_shards // self.options.num_shards
    shards = micro_batches(batch, m_local)
    rows = [per_example(jax.tree.map(lambda x: x[i], shards)) for i in range(m_local)]
    local = jax.tree.map(lambda *xs: jnp.concatenate(xs), *rows)  # This device's rows, in global order.
    every = lax.all_gather(local, axis.name, tiled=True)
    return {group: jax.tree.map(jnp.max if group == "max" else _pairwise_sum, values) for group, values in every.items()}


def _shard_total(x: jax.Array) -> jax.Array:
  """[m, k, ...] -> [m, ...]: a float's k pieces summed in order; an integer (state) as after the last piece."""
  # The k parts of each row added one after another, in order.
  return functools.reduce(jnp.add, [x[:, i] for i in range(x.shape[1])]) if is_float(x) else x[:, -1]


def _tree_total(x: jax.Array) -> jax.Array:
  """[m, ...] -> [...]: floats summed along the fixed tree; integers as micro-shard 0 left them (no sum)."""
  return _pairwise_sum(x) if is_float(x) else x[0]


def _pairwise_sum(x: jax.Array) -> jax.Array:
  """Sum over the leading axis along a balanced binary tree, in a fixed order (zero-padded to a power of two)."""
  size = 1 << max(x.shape[0] - 1, 0).bit_length()
  x = jnp.concatenate([x, jnp.zeros((size - x.shape[0], *x.shape[1:]), x.dtype)]) if size > x.shape[0] else x
  while x.shape[0] > 1:
    x = x[0::2] + x[1::2]
  return x[0]
