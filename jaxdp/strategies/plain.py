"""Plain data parallelism (PyTorch DDP): local gradients, one all-reduce of their mean, the same update everywhere."""

import jax
import jax.numpy as jnp
from jax import lax

from jaxdp.strategies.base import DataAxis, Gradients, GradFn, PyTree, Strategy, micro_batches, pmean_floats


class DataParallel(Strategy):
  """Each replica's gradient (accumulated over `accum_steps` micro-batches) is averaged by one all-reduce."""

  def gradients(self, grad_fn: GradFn, state: PyTree, batch: dict, rng: jax.Array, axis: DataAxis) -> Gradients:
    loss, accuracy, model_state, grads = local_gradients(grad_fn, state, batch, rng, axis, self.options.accum_steps)
    grads = self.reduce(grads, axis)
    # Model state (e.g. BatchNorm running statistics) is averaged too, so the replicas stay identical.
    return lax.pmean(loss, axis.name), lax.pmean(accuracy, axis.name), pmean_floats(model_state, axis.name), grads

  def reduce(self, grads: PyTree, axis: DataAxis) -> PyTree:
    """The mean gradient over all replicas: the all-reduce of data parallelism."""
    return all_reduce_mean(grads, axis.name, self.options.allreduce_dtype)


def local_gradients(grad_fn: GradFn, state: PyTree, batch: dict, rng: jax.Array, axis: DataAxis,
                    k: int) -> Gradients:
  """Mean loss, accuracy, new model state and gradients over this replica's slice, with no communication.

  With k > 1 the slice is cut into k micro-batches, run one after another, and their gradients are
  averaged locally (DDP's `no_sync`): the all-reduce still happens once. Micro-batch i of device d
  draws its randomness (dropout) from `fold_in(rng, d * k + i)`: its place in the global batch.
  """
  params, first = axis.vary(state.params), lax.axis_index(axis.name) * k
  if k == 1:
    (loss, (accuracy, model_state)), grads = grad_fn(params, state.model_state, batch, jax.random.fold_in(rng, first))
    return loss, accuracy, model_state, grads

  def micro_step(carry: tuple, xs: tuple) -> tuple:
    model_state, grad_sum, loss_sum, acc_sum = carry
    micro, i = xs
    (loss, (accuracy, model_state)), grads = grad_fn(params, model_state, micro, jax.random.fold_in(rng, first + i))
    return (model_state, jax.tree.map(jnp.add, grad_sum, grads), loss_sum + loss, acc_sum + accuracy), None

  zero_sums = axis.vary((jax.tree.map(jnp.zeros_like, state.params), jnp.float32(0), jnp.float32(0)))
  carry = (axis.vary(state.model_state), *zero_sums)
  (model_state, grad_sum, loss_sum, acc_sum), _ = lax.scan(micro_step, carry, (micro_batches(batch, k), jnp.arange(k)))
  return loss_sum / k, acc_sum / k, model_state, jax.tree.map(lambda g: g / k, grad_sum)


def all_reduce_mean(tree: PyTree, axis_name: str, dtype: str = "float32") -> PyTree:
  """`lax.pmean` over the axis, communicated in `dtype` (results back in their own dtype)."""
  return jax.tree.map(lambda g: lax.pmean(g.astype(dtype), axis_name).astype(g.dtype), tree)
