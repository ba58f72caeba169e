"""The training state and the pure per-replica train and eval steps.

Both steps run on ONE replica's slice of the batch and reduce across replicas over a named axis;
`jaxdp.parallel` maps them over devices (pmap or shard_map). Nothing here is jitted.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax import lax

from jaxdp import zero
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


@dataclasses.dataclass(frozen=True)
class StepOptions:
  """How the per-replica step computes and communicates; from the config."""
  accum_steps: int = 1                 # Micro-batches per optimizer step; gradients all-reduced once.
  compute_dtype: str = "float32"       # Forward/backward dtype; parameters and updates stay float32.
  allreduce_dtype: str = "float32"     # Dtype of the gradient all-reduce (bfloat16 halves its bytes).
  shard_optimizer_state: bool = False  # ZeRO-1: optimizer state sharded over the data axis.
  num_shards: int = 1                  # Devices on the data axis (ZeRO-1 shard count).
  invariant: bool = False              # Bitwise the same result for any device count (see _invariant_gradients).
  invariant_shards: int = 8            # Fixed micro-shards of the global batch in invariant mode.
  cast_inputs: bool = True             # Cast float inputs to compute_dtype (not token ids carried as floats).

  @classmethod
  def from_config(cls, config: Any, num_devices: int = 1, cast_inputs: bool = True) -> "StepOptions":
    return cls(accum_steps=config.get("grad_accum_steps", 1), compute_dtype=config.get("dtype", "float32"),
               allreduce_dtype=config.parallel.get("allreduce_dtype", "float32"),
               shard_optimizer_state=config.parallel.get("shard_optimizer_state", False), num_shards=num_devices,
               invariant=config.parallel.get("invariant", False),
               invariant_shards=config.parallel.get("invariant_shards", 8), cast_inputs=cast_inputs)


def init_state(rng: jax.Array, *, model: Model, tx: optax.GradientTransformation,
               options: StepOptions = StepOptions()) -> TrainState:
  """A fresh state: parameters from `rng`, zero step."""
  init_rng, state_rng = jax.random.split(rng)
  params, model_state = model.init(init_rng)
  opt_params = zero.flatten(params, options.num_shards) if options.shard_optimizer_state else params
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, model_state=model_state,
                    opt_state=tx.init(opt_params), rng=state_rng)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example softmax cross-entropy with integer labels."""
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)


def train_step(state: TrainState, batch: dict[str, jax.Array], *, model: Model,
               tx: optax.GradientTransformation, axis: DataAxis,
               options: StepOptions = StepOptions()) -> tuple[TrainState, Metrics]:
  """One optimizer step on this replica's slice; gradients are averaged over `axis` once."""
  rng = jax.random.fold_in(state.rng, state.step)
  if options.invariant:
    loss, accuracy, model_state, grads = _invariant_gradients(state, batch, model=model, rng=rng, axis=axis,
                                                              options=options)
  else:
    loss, accuracy, model_state, grads = _local_gradients(state, batch, model=model, rng=rng, axis=axis,
                                                          options=options)
    loss, accuracy = lax.pmean(loss, axis.name), lax.pmean(accuracy, axis.name)
  reduce, update = (zero.reduce_gradients, zero.update) if options.shard_optimizer_state else (_reduce, _update)
  grads, finite = reduce(grads, loss, axis=axis, options=options)
  if not options.invariant:  # Identical already in invariant mode; a pmean could round them.
    model_state = _pmean_floats(model_state, axis.name)

  def apply() -> TrainState:
    params, opt_state = update(state, grads, tx=tx, axis=axis, options=options)
    return state.replace(params=params, model_state=model_state, opt_state=opt_state)

  # A NaN/Inf on any replica reaches every replica through the reductions, so all of them take the
  # same decision: skip this update (the batch is still consumed). The update is computed inside the
  # cond, so the old and new states are never both alive (no copy of the state each step), and no
  # select is fused into it (a fused select rounded the update differently from program to program).
  new_state = lax.cond(finite, apply, lambda: state)
  return new_state.replace(step=state.step + 1), {
      "loss": loss, "accuracy": accuracy, "nonfinite": 1 - finite.astype(jnp.int32)}


def _local_gradients(state: TrainState, batch: dict[str, jax.Array], *, model: Model, rng: jax.Array,
                     axis: DataAxis, options: StepOptions) -> tuple[jax.Array, jax.Array, PyTree, PyTree]:
  """Mean loss, accuracy, new model state and gradients over this replica's slice, with no communication.

  With `accum_steps` = k the slice is cut into k micro-batches, run one after another, and their
  gradients are averaged locally (PyTorch DDP's `no_sync`): the all-reduce still happens once.
  """
  grad_fn = _grad_fn(model, options)
  params, k = axis.vary(state.params), options.accum_steps
  if k == 1:
    (loss, (accuracy, model_state)), grads = grad_fn(params, state.model_state, batch, rng)
    return loss, accuracy, model_state, grads

  def micro_step(carry: tuple, xs: tuple) -> tuple:
    model_state, grad_sum, loss_sum, acc_sum = carry
    micro, i = xs
    (loss, (accuracy, model_state)), grads = grad_fn(params, model_state, micro, jax.random.fold_in(rng, i))
    return (model_state, jax.tree.map(jnp.add, grad_sum, grads), loss_sum + loss, acc_sum + accuracy), None

  micro_batches = jax.tree.map(lambda x: x.reshape(k, x.shape[0] // k, *x.shape[1:]), batch)
  zero_sums = axis.vary((jax.tree.map(jnp.zeros_like, state.params), jnp.float32(0), jnp.float32(0)))
  carry = (axis.vary(state.model_state), *zero_sums)
  (model_state, grad_sum, loss_sum, acc_sum), _ = lax.scan(micro_step, carry, (micro_batches, jnp.arange(k)))
  return loss_sum / k, acc_sum / k, model_state, jax.tree.map(lambda g: g / k, grad_sum)


def _grad_fn(model: Model, options: StepOptions) -> Callable:
  """(params, model_state, batch, rng) -> ((mean loss, (accuracy, model_state)), grads), in compute dtype."""
  dtype = jnp.dtype(options.compute_dtype)

  def loss_fn(params: PyTree, model_state: PyTree, micro: dict, micro_rng: jax.Array) -> tuple:
    logits, model_state = model.apply(_cast_floats(params, dtype), model_state, _inputs(micro, options),
                                      train=True, rng=micro_rng)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == micro["labels"])
    return cross_entropy(logits, micro["labels"]).mean(), (accuracy, model_state)

  return jax.value_and_grad(loss_fn, has_aux=True)


def _inputs(batch: dict, options: StepOptions) -> jax.Array:
  x = batch["inputs"]
  if options.cast_inputs and jnp.issubdtype(x.dtype, jnp.floating):
    return x.astype(options.compute_dtype)
  return x


def _invariant_gradients(state: TrainState, batch: dict[str, jax.Array], *, model: Model, rng: jax.Array,
                         axis: DataAxis, options: StepOptions) -> tuple[jax.Array, jax.Array, PyTree, PyTree]:
  """Loss, accuracy, model state and gradients that are bitwise the same for any device count.

  The global batch is cut into M fixed micro-shards (M a power of two); device d runs its M/N of them
  one after another (the same computation whatever N is), and the M results are summed along one
  fixed balanced binary tree: each device sums its subtree, an all-gather brings the N subtree sums
  to every device, and each finishes the tree in the same order. Randomness is keyed by the global
  micro-shard index, never by the device. Costs an all-gather of N gradient copies instead of an
  all-reduce, and the micro-shards run sequentially.
  """
  m_local = options.invariant_shards // options.num_shards
  micro_batches = jax.tree.map(lambda x: x.reshape(m_local, x.shape[0] // m_local, *x.shape[1:]), batch)
  first = lax.axis_index(axis.name) * m_local
  grad_fn = _grad_fn(model, options)

  def one(_: None, xs: tuple) -> tuple:
    micro, i = xs
    (loss, (accuracy, model_state)), grads = grad_fn(state.params, state.model_state, micro,
                                                     jax.random.fold_in(rng, first + i))
    return None, (loss, accuracy, model_state, grads)

  # Unrolled, not a loop: XLA:CPU compiles a convolution differently (and slowly) inside a loop, and
  # how much it unrolls depends on the trip count, i.e. on N.
  outs = [one(None, (jax.tree.map(lambda x: x[i], micro_batches), i))[1] for i in range(m_local)]
  per_shard = jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
  subtree = jax.tree.map(_pairwise_sum, per_shard)
  total = jax.tree.map(_pairwise_sum, lax.all_gather(subtree, axis.name))
  loss, accuracy, model_state, grads = jax.tree.map(lambda x: x / options.invariant_shards, total)
  return loss, accuracy, model_state, grads


def _pairwise_sum(x: jax.Array) -> jax.Array:
  """Sum over the leading axis (a power of two) along a balanced binary tree, in a fixed order."""
  while x.shape[0] > 1:
    x = x[0::2] + x[1::2]
  return x[0]


def _reduce(grads: PyTree, loss: jax.Array, *, axis: DataAxis, options: StepOptions) -> tuple[PyTree, jax.Array]:
  """The mean gradient over all replicas, and whether it (and the loss) is finite."""
  if not options.invariant:  # (The invariant mode has already reduced them, in a fixed order.)
    grads = all_reduce_mean(grads, axis.name, options.allreduce_dtype)  # The all-reduce of data parallelism.
  return grads, _all_finite((loss, grads))


def _update(state: TrainState, grads: PyTree, *, tx: optax.GradientTransformation, axis: DataAxis,
            options: StepOptions) -> tuple[PyTree, PyTree]:
  """The same optax update on every replica."""
  del axis, options
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  return optax.apply_updates(state.params, updates), opt_state


def all_reduce_mean(tree: PyTree, axis_name: str, dtype: str = "float32") -> PyTree:
  """`lax.pmean` over the axis, communicated in `dtype` (results back in their own dtype)."""
  return jax.tree.map(lambda g: lax.pmean(g.astype(dtype), axis_name).astype(g.dtype), tree)


def _cast_floats(tree: PyTree, dtype: jnp.dtype) -> PyTree:
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def eval_step(state: TrainState, batch: dict[str, jax.Array], *, model: Model, axis: DataAxis,
              options: StepOptions = StepOptions()) -> Metrics:
  """Sums of loss, correct predictions, real examples and their targets over all replicas (padding masked out).

  Labels may have more dims than the [B] mask (e.g. [B, T] next tokens): every label is one target.
  """
  dtype = jnp.dtype(options.compute_dtype)
  logits, _ = model.apply(_cast_floats(state.params, dtype), state.model_state, _inputs(batch, options), train=False)
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
