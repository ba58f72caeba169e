"""Fully sharded data parallelism (mesh backend): parameters, gradients and optimizer state sharded over 'data' along
one dimension of each leaf; each parameter all-gathered where the loss uses it, its gradient reduce-scattered."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from jaxdp.config import ConfigError, Layout
from jaxdp.strategies import zero1_layout
from jaxdp.strategies.base import DataAxis, PyTree, all_finite
from jaxdp.strategies.plain import DataParallel, all_reduce_sum

GATHERED = "fsdp_gathered"  # The name the backward pass re-gathers instead of keeping: docs/design-notes.md#fully-sharded-data-parallelism


def sharded_dim(shape: tuple[int, ...], n: int) -> int | None:
  """The dimension a leaf of `shape` is sharded on over `n` devices (its largest that `n` divides), or None."""
  dims = [d for d in range(len(shape)) if shape[d] % n == 0 and shape[d] >= n]
  return max(dims, key=lambda d: (shape[d], -d)) if n > 1 and dims else None


def spec(shape: tuple[int, ...], n: int) -> P:
  """The PartitionSpec of a parameter leaf of `shape` over `n` devices: P() when it stays replicated."""
  dim = sharded_dim(shape, n)
  return P() if dim is None else P(*[None] * dim, "data")


def param_specs(abstract_params: PyTree, n: int) -> PyTree:
  """The parameters' PartitionSpecs over `n` devices: the one home of the FSDP layout."""
  return jax.tree.map(lambda x: spec(tuple(x.shape), n), abstract_params)


def _dim(s: P) -> int | None:
  """The sharded dimension of a `spec`, or None for P()."""
  return list(s).index("data") if "data" in tuple(s) else None


def _saved(prim: Any, *_: Any, **params: Any) -> bool:
  """The remat policy: every residual is saved but a gathered parameter (an all-gather's output, or its name)."""
  # jax's save_anything_except_these_names saves an all-gather's output under the name's input.
  return prim is not lax.all_gather_p and params.get("name") != GATHERED


class FSDP(DataParallel):
  """Gather each parameter inside the loss (re-gathered in backward), reduce-scatter its gradient, update the shard."""
  flag = "shard_params"
  title = "FSDP"
  holds = "parameters, gradients and optimizer state sharded (shard_params)"
  checked = False  # The loss all-gathers itself; `grad` then adds no implicit psum.
  shards_state = True

  def __init__(self, *args: Any, **kwargs: Any):
    super().__init__(*args, **kwargs)
    self.specs: PyTree = None  # The parameters' PartitionSpecs, set by `state_specs` (the state's layout).

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict, layout: Layout) -> None:
    """What shard_params cannot serve, each with why."""
    del layout
    if config.parallel.invariant:
      raise ConfigError("parallel.shard_params cannot serve parallel.invariant: the gradient of a sharded parameter "
                        "is summed by a reduce-scatter whose order depends on the device count")
    if config.parallel.shard_optimizer_state:
      raise ConfigError("parallel.shard_params already shards the optimizer state; unset "
                        "parallel.shard_optimizer_state (ZeRO-1)")
    if config.parallel.allreduce_dtype != "float32":
      raise ConfigError(f"parallel.shard_params reduce-scatters the gradient as the float32 parameters are gathered; "
                        f"parallel.allreduce_dtype={config.parallel.allreduce_dtype!r} cannot apply")

  def state_specs(self, abstract_state: PyTree) -> PyTree:
    """Parameters and the optimizer state that mirrors them as `param_specs`; everything else replicated."""
    self.specs = param_specs(abstract_state.params, self.options.num_shards)
    opt = zero1_layout._map_mirrors(abstract_state, lambda path, mirror: self.specs,
                                    keep=lambda path, x: jax.tree.map(lambda _: P(), x))
    return jax.tree.map(lambda _: P(), abstract_state).replace(params=self.specs, opt_state=opt)

  def _layout(self) -> PyTree:
    if self.specs is None:
      raise RuntimeError("FSDP lays out the state in state_specs (DataParallel.prepare): call it first")
    return self.specs

  def gather(self, params: PyTree, axis: DataAxis) -> PyTree:
    """This replica's shards -> the whole parameters, each leaf all-gathered on its sharded dimension."""
    def one(x: jax.Array, s: P) -> jax.Array:
      dim = _dim(s)
      return x if dim is None else checkpoint_name(lax.all_gather(x, axis.name, axis=dim, tiled=True), GATHERED)
    return jax.tree.map(one, params, self._layout())

  def on_shards(self, loss_fn: Callable[..., Any], axis: DataAxis) -> Callable[..., Any]:
    """`loss_fn(params, ...)` of the shards: gathered inside, so that `grad` reduce-scatters each gradient; the
    backward pass gathers again rather than keep every gathered parameter alive (PyTorch's reshard_after_forward)."""
    return jax.checkpoint(lambda params, *rest: loss_fn(self.gather(params, axis), *rest), policy=_saved)

  def reduce(self, grads: PyTree, axis: DataAxis) -> PyTree:
    """Sharded leaves came out of `grad` reduce-scattered already; the replicated ones are summed here."""
    replicated = [g for g, s in zip(jax.tree.leaves(grads), jax.tree.leaves(self._layout())) if _dim(s) is None]
    summed = iter(all_reduce_sum(replicated, axis.name, self.options.allreduce_dtype))
    return jax.tree.map(lambda g, s: next(summed) if _dim(s) is None else g, grads, self._layout())

  def finite(self, loss: jax.Array, grads: PyTree, axis: DataAxis) -> jax.Array:
    # Every device checked only its shards: agree collectively, so all skip (or apply) together.
    return lax.pmin(all_finite((loss, grads)).astype(jnp.int32), axis.name).astype(bool)

  def global_norm(self, grads: PyTree, axis: DataAxis) -> jax.Array:
    # Shards' squares summed over devices; a replicated leaf, the same everywhere, is added once, outside the psum.
    squares = [(jnp.sum(jnp.square(g.astype(jnp.float32))), _dim(s) is None)
               for g, s in zip(jax.tree.leaves(grads), jax.tree.leaves(self._layout()))]
    sharded = sum((q for q, rep in squares if not rep), jnp.float32(0))
    replicated = sum((q for q, rep in squares if rep), jnp.float32(0))
    return jnp.sqrt(lax.psum(sharded, axis.name) + replicated)

  def apply(self, state: PyTree, grads: PyTree, tx: optax.GradientTransformation,
            axis: DataAxis) -> tuple[PyTree, PyTree]:
    del axis  # An elementwise optimizer (`zero1_check`) updates each shard alone; no gather after it.
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return optax.apply_updates(state.params, updates), opt_state
