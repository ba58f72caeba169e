"""The training state and the pure per-replica train and eval steps (the `Strategy` crosses devices; unjitted)."""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax import lax

from jaxdp import loss_scale as loss_scale_lib
from jaxdp import tasks
from jaxdp.batch import INDEX, REAL
from jaxdp.models import Model
from jaxdp.strategies import DataAxis, DataParallel, GradFn, Strategy
from jaxdp.tasks import base as task_lib

__all__ = ["DataAxis", "TrainState", "eval_step", "init_state", "normalize", "train_step"]

PyTree = Any
Metrics = dict[str, jax.Array]
PLAIN = DataParallel()  # The default strategy: plain data parallelism, one micro-batch, float32.
CLASSIFICATION = tasks.Classification()  # The default task (config.task.name = "classification").


@struct.dataclass
class TrainState:
  """Everything that changes during training, as one pytree."""
  step: jax.Array          # int32 scalar: optimizer steps taken.
  params: PyTree           # What the optimizer trains.
  model_state: PyTree      # Non-trainable module state (e.g. BatchNorm statistics); never RNG state.
  opt_state: PyTree        # optax state, laid out as the strategy wants it.
  rng: jax.Array           # Base PRNG key (raw uint32[2]); each step folds in its number.
  loss_scale: loss_scale_lib.LossScale | None = None  # float16 compute only: the dynamic loss scale.


def init_state(rng: jax.Array, *, model: Model, tx: optax.GradientTransformation,
               strategy: Strategy = PLAIN) -> TrainState:
  """A fresh state: parameters from `rng`, zero step, optimizer state laid out as `strategy` wants it."""
  init_rng, state_rng = jax.random.split(rng)
  params, model_state = model.init(init_rng)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, model_state=model_state,
                    opt_state=strategy.init_opt_state(tx, params), rng=state_rng,
                    loss_scale=loss_scale_lib.initial(strategy.options.compute_dtype))


def train_step(state: TrainState, batch: dict[str, jax.Array], *, model: Model,
               tx: optax.GradientTransformation, axis: DataAxis, strategy: Strategy = PLAIN,
               task: tasks.Task = CLASSIFICATION, cast_inputs: bool = True) -> tuple[TrainState, Metrics]:
  """One optimizer step on this replica's slice: reduced gradient, optional clipping, update (or skip); metrics.

  `cast_inputs`: float features reach the model in the compute dtype (False: token ids carried as floats).
  """
  options = strategy.options
  rng = jax.random.fold_in(state.rng, state.step)
  scale = None if state.loss_scale is None else state.loss_scale.scale
  on_shards = functools.partial(strategy.on_shards, axis=axis)  # Sharded parameters gathered inside the loss.
  grad_fn = _grad_fn(model, task, options.compute_dtype, cast_inputs, scale, on_shards)
  # Σ w·v over the global batch (each replica's micro-batches, then the replicas); one division here makes means.
  sums, model_state, grads = strategy.gradients(grad_fn, state, _task_batch(batch), rng, axis)
  weight = sums["weight"]["loss"]
  grads = normalize(grads, weight, scale)
  means = task_lib.means(sums)
  finite = strategy.finite(means["loss"], grads, axis)
  if options.max_grad_norm > 0:
    grads = _clip(grads, strategy.global_norm(grads, axis), options.max_grad_norm)

  def apply() -> TrainState:
    params, opt_state = strategy.apply(state, grads, tx, axis)
    return state.replace(params=params, model_state=model_state, opt_state=opt_state)

  # A NaN/Inf reaches every replica through the reductions: all skip this update alike (the batch is consumed).
  # Inside the cond, the old and new states are never both alive, and no select is fused into the update
  # (a fused select rounded it differently from program to program; docs/design-notes.md#nan-guard).
  new_state = lax.cond(finite & (weight > 0), apply, lambda: state).replace(step=state.step + 1)
  reported = {k: v for k, v in task_lib.flatten({**sums, "mean": means}).items() if not k.startswith("_")}
  out = {"loss": means["loss"], **reported, "nonfinite": 1 - finite.astype(jnp.int32),
         "zero_weight": (finite & (weight == 0)).astype(jnp.int32),
         "weight": {k: w for k, w in sums["weight"].items() if not k.startswith("_")},
         "negative_weight": {k: n.astype(jnp.int32) for k, n in sums["negative"].items()}}  # Refused on the host.
  if scale is not None:
    # A finite loss with a non-finite scaled gradient is the scale's overflow, not a failing run, until the
    # scale is down to 1: it only halves the scale (the NaN guard counts "nonfinite" steps).
    overflow = ~finite & jnp.isfinite(means["loss"]) & (scale > 1)
    new_state = new_state.replace(loss_scale=state.loss_scale.update(finite))
    out.update(nonfinite=(~finite & ~overflow).astype(jnp.int32), overflow=overflow.astype(jnp.int32),
               loss_scale=scale)
  return new_state, out


def normalize(grads: PyTree, weight: jax.Array, scale: jax.Array | None = None) -> PyTree:
  """The gradient of Σ w·ℓ [x scale] as that of the mean Σ w·ℓ / Σ w; zero where Σ w <= 0 (nothing to average)."""
  # One scalar reciprocal, then products: XLA:CPU's vectorized division rounded differently with the device
  # count, breaking the invariant mode's bitwise guarantee. Dividing by the scale, a power of two, is exact.
  inverse = jnp.where(weight > 0, 1 / jnp.where(weight > 0, weight, 1), 0) / (1 if scale is None else scale)
  return jax.tree.map(lambda g: g * inverse, grads)


def _clip(grads: PyTree, norm: jax.Array, max_norm: float) -> PyTree:
  """`optax.clip_by_global_norm` given the norm of the whole (reduced) gradient, however it is laid out."""
  return jax.tree.map(lambda g: lax.select(norm < max_norm, g, (g / norm.astype(g.dtype)) * max_norm), grads)


def _grad_fn(model: Model, task: tasks.Task, compute_dtype: str, cast_inputs: bool,
             scale: jax.Array | None = None, on_shards: Callable = lambda f: f) -> GradFn:
  """(params, model_state, batch, rng) -> ((Σ w·loss [x scale], (sums, model_state)), grads) in `compute_dtype`;
  `on_shards`: the strategy's loss of its parameters as the state holds them (`Strategy.on_shards`)."""
  dtype = jnp.dtype(compute_dtype)

  def loss_fn(params: PyTree, model_state: PyTree, micro: dict, micro_rng: jax.Array) -> tuple:
    bound = task_lib.BoundModel(model.apply, _cast_floats(params, dtype), model_state, train=True, rng=micro_rng,
                                dtype=dtype, cast_inputs=cast_inputs)
    sums = task_lib.by_kind(task_lib.run(task, bound, micro))
    loss = sums["mean"]["loss"]
    return (loss if scale is None else loss * scale), (sums, bound.state)

  return jax.value_and_grad(on_shards(loss_fn), has_aux=True)


def _cast_floats(tree: PyTree, dtype: jnp.dtype) -> PyTree:
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _task_batch(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """The batch without jaxdp's own keys (the audit's ids, eval padding): a task sees the dataset's features only."""
  return {k: v for k, v in batch.items() if k not in (INDEX, REAL)}


def eval_step(state: TrainState, batch: dict[str, jax.Array], *, model: Model, axis: DataAxis,
              strategy: Strategy = PLAIN, task: tasks.Task = CLASSIFICATION,
              cast_inputs: bool = True) -> Metrics:
  """The task's metrics summed by kind over the real rows of all replicas, per element (`tasks.base.per_row`)."""
  dtype = jnp.dtype(strategy.options.compute_dtype)

  def per_example(rows: dict[str, jax.Array]) -> dict[str, Any]:
    params = strategy.gather(state.params, axis)  # Whole, where the state holds shards.
    bound = task_lib.BoundModel(model.apply, _cast_floats(params, dtype), state.model_state, train=False,
                                rng=None, dtype=dtype, cast_inputs=cast_inputs)
    return task_lib.per_row(task_lib.run(task, bound, _task_batch(rows)), rows[REAL])

  return strategy.eval_sums(per_example, batch, axis)
