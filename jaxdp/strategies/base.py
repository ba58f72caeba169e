"""`Strategy`, the seam between the train step and how gradients cross devices, and what strategies share."""

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxdp.config import Layout
from jaxdp.tasks.base import reduce_rows

PyTree = Any
# Task metrics as mergeable scalars by group (`tasks.base.by_kind`): summed over micro-batches and devices, "max" maxed.
Scalars = dict[str, dict[str, jax.Array]]
# (params, model_state, micro-batch, rng) -> ((Σ w·loss, (Scalars, model_state)), grads of Σ w·loss), no communication.
GradFn = Callable[[PyTree, PyTree, dict, jax.Array], tuple]
# (rows) -> per-row eval values by kind (`jaxdp.tasks.base.per_row`): the "max" group maxed over rows, the rest summed.
EvalFn = Callable[[dict], dict[str, Any]]
# (metric sums, model_state, gradient of Σ w·loss) over the global batch; the step divides by the total weight once.
Gradients = tuple[Scalars, PyTree, PyTree]


@dataclasses.dataclass(frozen=True)
class DataAxis:
  """The device axis a per-replica step reduces over."""
  name: str = "data"
  # Under shard_map, `grad` of P()-replicated parameters already sums over devices: marked varying, it stays local
  # and the strategy's reduction is the only one. pmap tracks no such thing: off there.
  mark_varying: bool = False

  def vary(self, tree: PyTree) -> PyTree:
    """`tree` marked as varying over the axis (when `mark_varying`)."""
    if not self.mark_varying:
      return tree
    return jax.tree.map(lambda x: lax.pcast(x, self.name, to="varying"), tree)


@dataclasses.dataclass(frozen=True)
class StrategyOptions:
  """How the per-replica step computes and communicates its gradient; from the config."""
  accum_steps: int = 1                 # Micro-batches per optimizer step; gradients all-reduced once.
  compute_dtype: str = "float32"       # Forward/backward dtype; parameters and updates stay float32.
  allreduce_dtype: str = "float32"     # Dtype of the gradient all-reduce (bfloat16 halves its bytes).
  num_shards: int = 1                  # Devices on the data axis.
  invariant_shards: int = 8            # Fixed micro-shards of the global batch in the invariant strategy.
  max_grad_norm: float = 0.0           # Clip the reduced gradient to this global norm; 0: no clipping.

  @classmethod
  def from_config(cls, config: Any, num_devices: int = 1) -> "StrategyOptions":
    """The options of a config with its defaults filled (`jaxdp.config.with_defaults`), over `num_devices`."""
    return cls(accum_steps=config.grad_accum_steps, compute_dtype=config.dtype,
               allreduce_dtype=config.parallel.allreduce_dtype, num_shards=num_devices,
               invariant_shards=config.parallel.invariant_shards, max_grad_norm=float(config.max_grad_norm))


class Strategy(abc.ABC):
  """How gradients are reduced across replicas and applied; one instance per run, chosen in `jaxdp.build`."""
  flag: ClassVar[str | None] = None     # The `config.parallel` flag that picks it (`jaxdp.strategies.select`).
  title: ClassVar[str] = "plain data parallelism"  # How messages name it.
  holds: ClassVar[str] = "state replicated"  # How it lays the state out over the devices (the start summary).
  checked: ClassVar[bool] = True        # shard_map may check replication (False: the strategy gathers itself).
  shards_state: ClassVar[bool] = False  # Lays the state out other than replicated (needs the mesh backend).

  def __init__(self, options: StrategyOptions = StrategyOptions()):
    self.options = options

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict, layout: Layout) -> None:
    """Raises ConfigError naming a value this strategy cannot serve (after `config.validate`); default: none."""
    del config, layout

  @classmethod
  def compiler_options(cls, platform: str) -> dict[str, Any] | None:
    """XLA options this strategy's steps compile with on `platform` ('cpu', 'gpu', 'tpu'); default: none."""
    del platform
    return None

  def stored_opt_layout(self, wanted: PyTree, stored_leaf: Callable[[tuple], Any]) -> PyTree:
    """`wanted.opt_state` (of an abstract TrainState) as a checkpoint holds it: a replicated state, as it is."""
    del stored_leaf  # `stored_leaf(path)`: the stored (shape, dtype) of the opt_state leaf at `path`, or None.
    return wanted.opt_state

  def relayout_opt_state(self, opt_state: PyTree, wanted: PyTree, shardings: PyTree) -> PyTree:
    """Optimizer state read as `stored_opt_layout` said -> this run's layout (`wanted.opt_state`'s), placed."""
    del wanted, shardings  # Read in this run's layout already.
    return opt_state

  def init_opt_state(self, tx: optax.GradientTransformation, params: PyTree) -> PyTree:
    """The optimizer state for fresh parameters, in the layout `apply` expects."""
    return tx.init(params)

  def state_specs(self, abstract_state: PyTree) -> PyTree:
    """PartitionSpecs of the train state over the data axis: everything replicated."""
    return jax.tree.map(lambda _: P(), abstract_state)

  def gather(self, params: PyTree, axis: DataAxis) -> PyTree:
    """This replica's parameters as the state holds them -> the whole parameters: the same, unsharded."""
    del axis
    return params

  def on_shards(self, loss_fn: Callable[..., Any], axis: DataAxis) -> Callable[..., Any]:
    """`loss_fn(params, ...)` of whole parameters -> of the parameters as the state holds them: itself, unsharded."""
    del axis
    return loss_fn

  @abc.abstractmethod
  def gradients(self, grad_fn: GradFn, state: Any, batch: dict, rng: jax.Array, axis: DataAxis) -> Gradients:
    """The global batch's metric sums, model state and gradient of Σ w·loss (this replica's slice in), reduced."""

  def finite(self, loss: jax.Array, grads: PyTree, axis: DataAxis) -> jax.Array:
    """Whether loss and gradient are finite, the same answer on every replica."""
    del axis  # The reduced values are the same on every replica already.
    return all_finite((loss, grads))

  def global_norm(self, grads: PyTree, axis: DataAxis) -> jax.Array:
    """The global L2 norm of the reduced gradient."""
    del axis
    return optax.tree.norm(grads)

  def apply(self, state: Any, grads: PyTree, tx: optax.GradientTransformation,
            axis: DataAxis) -> tuple[PyTree, PyTree]:
    """New (params, opt_state) from the reduced gradient, identical on every replica."""
    del axis  # Every replica applies the same update to the same parameters.
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return optax.apply_updates(state.params, updates), opt_state

  def eval_sums(self, per_example: EvalFn, batch: dict, axis: DataAxis) -> dict[str, Any]:
    """Eval sums (the "max" group: maxima) over the global batch's rows from this replica's slice."""
    return {group: jax.tree.map(lambda v: reduce_rows(group, _global_rows(v, axis.name)), values)
            for group, values in per_example(batch).items()}


def _global_rows(rows: jax.Array, axis_name: str) -> jax.Array:
  """[rows] on each replica -> the [N * rows] of the global batch on every replica, bit for bit."""
  # A psum of zeros and one replica's values is exact: the rows' sum does not round by the device count.
  n, i = lax.axis_size(axis_name), lax.axis_index(axis_name)
  placed = lax.dynamic_update_slice(jnp.zeros((n * rows.shape[0],), rows.dtype), rows, (i * rows.shape[0],))
  return lax.psum(placed, axis_name)


def all_finite(tree: PyTree) -> jax.Array:
  """True when every element of every leaf is finite (False also if their float32 sum overflows)."""
  # One fused sum per leaf, not an `isfinite` per element and its boolean copy (docs/design-notes.md#finite-check).
  return jnp.isfinite(sum(jnp.sum(x, dtype=jnp.float32) for x in jax.tree.leaves(tree)))


def is_float(x: jax.Array) -> bool:
  """Whether `x` is a floating-point leaf (a statistic, averaged) rather than an integer one (state, a count)."""
  return jnp.issubdtype(x.dtype, jnp.floating)


def pmean_floats(tree: PyTree, axis_name: str) -> PyTree:
  """Averages float leaves (e.g. BatchNorm statistics) so replicas stay identical; keeps the rest."""
  return jax.tree.map(lambda x: lax.pmean(x, axis_name) if is_float(x) else x, tree)


def integers_of_replica_zero(tree: PyTree, axis_name: str) -> PyTree:
  """Non-float leaves (e.g. counters) as replica 0 has them, on every replica, exactly; float leaves as they are."""

  def replica_zero(x: jax.Array) -> jax.Array:  # A psum of replica 0's value and zeros: an integer is never averaged.
    wide = jnp.int32 if x.dtype == jnp.bool_ else x.dtype  # psum takes no bool.
    return lax.psum(jnp.where(lax.axis_index(axis_name) == 0, x.astype(wide), jnp.zeros_like(x, wide)),
                    axis_name).astype(x.dtype)

  return jax.tree.map(lambda x: x if is_float(x) else replica_zero(x), tree)


def reduce_metrics(metrics: Scalars, axis_name: str) -> Scalars:
  """Each replica's metric sums over all replicas: psum of every group, pmax of the maxima."""
  return {kind: {k: (lax.pmax if kind == "max" else lax.psum)(v, axis_name) for k, v in values.items()}
          for kind, values in metrics.items()}


def micro_batches(batch: dict, k: int) -> dict:
  """[rows, ...] -> [k, rows / k, ...]: k consecutive micro-batches."""
  return jax.tree.map(lambda x: x.reshape(k, x.shape[0] // k, *x.shape[1:]), batch)
