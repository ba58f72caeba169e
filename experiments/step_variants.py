"""Variants of jaxdp's train step, rebuilt from step.py's own pieces with one thing changed, to measure
what that thing costs (experiments/overhead.py) and what a proposed change would gain
(experiments/ddp_compare.py). jaxdp itself never imports this.

Three changes are measured:
  guard  how a non-finite update is skipped. "where": `jnp.where(finite, new, old)` over every leaf of
         the state (jaxdp's first guard); XLA then keeps the old state alive next to the new one and
         copies it every step. "cond": one `lax.cond(finite, update, keep)` with the update computed
         inside the true branch (what jaxdp's step does since this study found the copies). "none".
  flat   jaxdp all-reduces the gradients leaf by leaf and the loss and accuracy separately; XLA
         combines them into one all-reduce instruction, but XLA:CPU runs each operand as its own gloo
         collective, with a fixed cost each. `flat` reduces one buffer holding every gradient, the loss
         and the accuracy: one collective per step (`strategies.plain.flat_all_reduce_mean`, as jaxdp's step
         now does across CPU processes).
  allreduce  False: no collective at all, each replica keeps its own gradient (the replicas drift apart;
         timing only, run unchecked): what the step costs without its all-reduce, as DDP's `no_sync()`.
"""

from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxdp import step as step_lib
from jaxdp.strategies import base, plain


def train_step(state: step_lib.TrainState, batch: dict[str, jax.Array], *, model: Any,
               tx: optax.GradientTransformation, axis: step_lib.DataAxis, guard: str = "where",
               flat: bool = False, allreduce: bool = True) -> tuple[step_lib.TrainState, dict[str, jax.Array]]:
  """jaxdp's per-replica step (float32, no accumulation) with the guard done by `guard` and, with `flat`,
  one all-reduce of everything (none without `allreduce`)."""
  rng = jax.random.fold_in(state.rng, state.step)
  grad_fn = step_lib._grad_fn(model, step_lib.CLASSIFICATION, "float32", True)
  metrics, model_state, grads = plain.local_gradients(grad_fn, state, batch, rng, axis, 1)
  loss, accuracy = metrics["mean"]["loss"], metrics["mean"]["accuracy"]
  if allreduce:
    loss, accuracy, model_state, grads = _means(loss, accuracy, model_state, grads, axis.name, flat)
  finite = base.all_finite((loss, grads))

  def update() -> step_lib.TrainState:
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return state.replace(params=optax.apply_updates(state.params, updates), model_state=model_state,
                         opt_state=opt_state)

  if guard == "cond":
    new_state = lax.cond(finite, update, lambda: state)
  elif guard == "where":
    new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), update(), state)
  else:
    new_state = update()
  return new_state.replace(step=state.step + 1), {
      "loss": loss, "accuracy": accuracy, "nonfinite": 1 - finite.astype(jnp.int32)}


def _means(loss: jax.Array, accuracy: jax.Array, model_state: Any, grads: Any, axis_name: str, flat: bool) -> tuple:
  """Loss, accuracy, model state and gradients averaged over the replicas, in one flat all-reduce or per leaf."""
  model_state = base.pmean_floats(model_state, axis_name)
  if flat:  # As jaxdp's step across CPU processes (one row of leaves: ravel_pytree's 1-D concatenate is slow there).
    loss, accuracy, grads = plain.flat_all_reduce_mean((loss, accuracy, grads), axis_name)
    return loss, accuracy, model_state, grads
  return lax.pmean(loss, axis_name), lax.pmean(accuracy, axis_name), model_state, plain.all_reduce_mean(grads, axis_name)
