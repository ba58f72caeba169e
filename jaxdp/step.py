"""The training state and the pure per-replica train and eval steps.

Both steps run on ONE replica's slice of the batch; how gradients cross devices is the `Strategy`'s
job (`jaxdp.strategies`: plain data parallelism, the invariant mode, ZeRO-1, with its `StrategyOptions`),
and what is learned is the task's (`TaskOptions`: the loss's label smoothing, which inputs are cast), so
the step itself is the textbook one. `jaxdp.parallel` maps the steps over devices (pmap or shard_map). Nothing here is jitted.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax import lax

from jaxdp.batch import REAL
from jaxdp.models import Model
from jaxdp.strategies import DataAxis, DataParallel, GradFn, Strategy

__all__ = ["DataAxis", "TaskOptions", "TrainState", "cross_entropy", "eval_step", "init_state", "train_step"]

PyTree = Any
Metrics = dict[str, jax.Array]
PLAIN = DataParallel()  # The default strategy: plain data parallelism, one micro-batch, float32.


@dataclasses.dataclass(frozen=True)
class TaskOptions:
  """What the step learns from a batch, apart from how its gradient crosses devices; from the config."""
  label_smoothing: float = 0.0  # Train loss against (1 - s) one-hot + s / classes; eval loss stays plain.
  cast_inputs: bool = True      # Cast float inputs to the compute dtype (not token ids carried as floats).

  @classmethod
  def from_config(cls, config: Any, cast_inputs: bool = True) -> "TaskOptions":
    """The options of a config with its defaults filled (`jaxdp.config.with_defaults`)."""
    return cls(label_smoothing=float(config.label_smoothing), cast_inputs=cast_inputs)


@struct.dataclass
class TrainState:
  """Everything that changes during training, as one pytree."""
  step: jax.Array          # int32 scalar: optimizer steps taken.
  params: PyTree           # What the optimizer trains.
  model_state: PyTree      # Non-trainable module state (e.g. BatchNorm statistics); never RNG state.
  opt_state: PyTree        # optax state, laid out as the strategy wants it.
  rng: jax.Array           # Base PRNG key (raw uint32[2]); each step folds in its number.


def init_state(rng: jax.Array, *, model: Model, tx: optax.GradientTransformation,
               strategy: Strategy = PLAIN) -> TrainState:
  """A fresh state: parameters from `rng`, zero step, optimizer state laid out as `strategy` wants it."""
  init_rng, state_rng = jax.random.split(rng)
  params, model_state = model.init(init_rng)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, model_state=model_state,
                    opt_state=strategy.init_opt_state(tx, params), rng=state_rng)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example softmax cross-entropy with integer labels."""
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)


def train_step(state: TrainState, batch: dict[str, jax.Array], *, model: Model,
               tx: optax.GradientTransformation, axis: DataAxis, strategy: Strategy = PLAIN,
               task: TaskOptions = TaskOptions()) -> tuple[TrainState, Metrics]:
  """One optimizer step on this replica's slice: reduced gradient, optional clipping, update (or skip)."""
  options = strategy.options
  rng = jax.random.fold_in(state.rng, state.step)
  grad_fn = _grad_fn(model, task, options.compute_dtype)
  loss, accuracy, model_state, grads = strategy.gradients(grad_fn, state, batch, rng, axis)
  finite = strategy.finite(loss, grads, axis)
  if options.max_grad_norm > 0:
    grads = _clip(grads, strategy.global_norm(grads, axis), options.max_grad_norm)

  def apply() -> TrainState:
    params, opt_state = strategy.apply(state, grads, tx, axis)
    return state.replace(params=params, model_state=model_state, opt_state=opt_state)

  # A NaN/Inf on any replica reaches every replica through the reductions, so all of them take the
  # same decision: skip this update (the batch is still consumed). The update is computed inside the
  # cond, so the old and new states are never both alive (no copy of the state each step), and no
  # select is fused into it (a fused select rounded the update differently from program to program).
  new_state = lax.cond(finite, apply, lambda: state)
  return new_state.replace(step=state.step + 1), {
      "loss": loss, "accuracy": accuracy, "nonfinite": 1 - finite.astype(jnp.int32)}


def _clip(grads: PyTree, norm: jax.Array, max_norm: float) -> PyTree:
  """`optax.clip_by_global_norm` given the norm of the whole (reduced) gradient, however it is laid out."""
  return jax.tree.map(lambda g: lax.select(norm < max_norm, g, (g / norm.astype(g.dtype)) * max_norm), grads)


def smoothed_cross_entropy(logits: jax.Array, labels: jax.Array, smoothing: float) -> jax.Array:
  """Per-example cross-entropy against labels smoothed by `smoothing` (Szegedy et al., 2016); 0: `cross_entropy`."""
  if not smoothing:
    return cross_entropy(logits, labels)
  targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), smoothing)
  return optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)


def _grad_fn(model: Model, task: TaskOptions, compute_dtype: str) -> GradFn:
  """(params, model_state, batch, rng) -> ((mean loss, (accuracy, model_state)), grads), in `compute_dtype`."""
  dtype = jnp.dtype(compute_dtype)

  def loss_fn(params: PyTree, model_state: PyTree, micro: dict, micro_rng: jax.Array) -> tuple:
    logits, model_state = model.apply(_cast_floats(params, dtype), model_state, _inputs(micro, task, dtype),
                                      train=True, rng=micro_rng)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == micro["labels"])
    loss = smoothed_cross_entropy(logits, micro["labels"], task.label_smoothing).mean()
    return loss, (accuracy, model_state)

  return jax.value_and_grad(loss_fn, has_aux=True)


def _inputs(batch: dict, task: TaskOptions, dtype: jnp.dtype) -> jax.Array:
  x = batch["inputs"]
  if task.cast_inputs and jnp.issubdtype(x.dtype, jnp.floating):
    return x.astype(dtype)
  return x


def _cast_floats(tree: PyTree, dtype: jnp.dtype) -> PyTree:
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def eval_step(state: TrainState, batch: dict[str, jax.Array], *, model: Model, axis: DataAxis,
              strategy: Strategy = PLAIN, task: TaskOptions = TaskOptions()) -> Metrics:
  """Sums of loss, correct predictions, real examples and their targets over all replicas (padding masked out).

  Labels may have more dims than the [B] mask (e.g. [B, T] next tokens): every label is one target.
  """
  dtype = jnp.dtype(strategy.options.compute_dtype)

  def per_example(rows: dict[str, jax.Array]) -> dict[str, jax.Array]:
    logits, _ = model.apply(_cast_floats(state.params, dtype), state.model_state, _inputs(rows, task, dtype),
                            train=False)
    labels, mask = rows["labels"], rows[REAL]
    targets = jnp.broadcast_to(mask.reshape(mask.shape + (1,) * (labels.ndim - 1)), labels.shape)
    correct = (jnp.argmax(logits, -1) == labels) & targets
    loss = jnp.where(targets, cross_entropy(logits, labels), 0.0)
    return {"loss_sum": _per_row(loss), "correct": _per_row(correct.astype(jnp.int32)),
            "num_examples": mask.astype(jnp.int32), "num_targets": _per_row(targets.astype(jnp.int32))}

  return strategy.eval_sums(per_example, batch, axis)


def _per_row(x: jax.Array) -> jax.Array:
  """[B, ...] -> [B]: one sum per example (over its targets)."""
  return x.reshape(x.shape[0], -1).sum(-1)
