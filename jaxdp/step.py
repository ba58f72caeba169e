"""The training state and the pure per-replica train and eval steps.

Both steps run on ONE replica's slice of the batch and reduce across replicas over a named axis;
`jaxdp.parallel` maps them over devices (pmap or shard_map). Nothing here is jitted.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax import lax

from jaxdp.models import Model

PyTree = Any
Metrics = dict[str, jax.Array]


@struct.dataclass
class TrainState:
  """Everything that changes during training, as one pytree."""
  step: jax.Array          # int32 scalar: optimizer steps taken.
  params: PyTree           # What the optimizer trains.
  model_state: PyTree      # Non-trainable module state (e.g. BatchNorm statistics).
  opt_state: PyTree        # optax state.
  rng: jax.Array           # Base PRNG key (raw uint32[2]); each step folds in its number.


@dataclasses.dataclass(frozen=True)
class DataAxis:
  """The device axis a per-replica step reduces over.

  Under shard_map, parameters replicated with P() are "invariant", and `jax.grad` of a per-device loss
  with respect to them already sums over devices; a pmean after that would give N times the gradient.
  `mark_varying` tells JAX the parameters may differ per device, so `grad` stays local and the one
  explicit pmean is the only all-reduce. Under pmap there is no such tracking, so it is off.
  """
  name: str = "data"
  mark_varying: bool = False

  def vary(self, tree: PyTree) -> PyTree:
    if not self.mark_varying:
      return tree
    return jax.tree.map(lambda x: lax.pcast(x, self.name, to="varying"), tree)


def init_state(rng: jax.Array, *, model: Model, tx: optax.GradientTransformation) -> TrainState:
  """A fresh state: parameters from `rng`, zero step."""
  init_rng, state_rng = jax.random.split(rng)
  params, model_state = model.init(init_rng)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, model_state=model_state,
                    opt_state=tx.init(params), rng=state_rng)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example softmax cross-entropy with integer labels."""
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)


def train_step(state: TrainState, batch: dict[str, jax.Array], *, model: Model,
               tx: optax.GradientTransformation, axis: DataAxis) -> tuple[TrainState, Metrics]:
  """One optimizer step on this replica's slice; gradients are averaged over `axis` with pmean."""
  rng = jax.random.fold_in(state.rng, state.step)

  def loss_fn(params: PyTree) -> tuple[jax.Array, tuple[jax.Array, PyTree]]:
    logits, model_state = model.apply(params, state.model_state, batch["inputs"], train=True, rng=rng)
    return cross_entropy(logits, batch["labels"]).mean(), (logits, model_state)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  (loss, (logits, model_state)), grads = grad_fn(axis.vary(state.params))
  grads = lax.pmean(grads, axis.name)  # The all-reduce of data parallelism.
  loss = lax.pmean(loss, axis.name)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  updated = state.replace(params=optax.apply_updates(state.params, updates),
                          model_state=_pmean_floats(model_state, axis.name), opt_state=opt_state)
  # A NaN/Inf on any replica reaches every replica through the pmeans above, so all of them take
  # the same decision: skip this update (the batch is still consumed).
  finite = _all_finite((loss, grads))
  new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), updated, state)
  accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["labels"])
  return new_state.replace(step=state.step + 1), {
      "loss": loss, "accuracy": lax.pmean(accuracy, axis.name), "nonfinite": 1 - finite.astype(jnp.int32)}


def eval_step(state: TrainState, batch: dict[str, jax.Array], *, model: Model, axis: DataAxis) -> Metrics:
  """Sums of loss, correct predictions, real examples and their targets over all replicas (padding masked out).

  Labels may have more dims than the [B] mask (e.g. [B, T] next tokens): every label is one target.
  """
  logits, _ = model.apply(state.params, state.model_state, batch["inputs"], train=False)
  labels, mask = batch["labels"], batch["mask"]
  targets = jnp.broadcast_to(mask.reshape(mask.shape + (1,) * (labels.ndim - 1)), labels.shape)
  correct = (jnp.argmax(logits, -1) == labels) & targets
  loss = jnp.where(targets, cross_entropy(logits, labels), 0.0)
  return {"loss_sum": lax.psum(loss.sum(), axis.name),
          "correct": lax.psum(correct.sum(dtype=jnp.int32), axis.name),
          "num_examples": lax.psum(mask.sum(dtype=jnp.int32), axis.name),
          "num_targets": lax.psum(targets.sum(dtype=jnp.int32), axis.name)}


def _all_finite(tree: PyTree) -> jax.Array:
  """True when every element of every leaf is finite."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _pmean_floats(tree: PyTree, axis_name: str) -> PyTree:
  """Averages float leaves (e.g. BatchNorm statistics) so replicas stay identical; keeps the rest."""
  return jax.tree.map(lambda x: lax.pmean(x, axis_name) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)
