"""Plain data parallelism (PyTorch DDP): local gradient sums, one all-reduce, the same update everywhere."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxdp.strategies import zero1_layout
from jaxdp.strategies.base import (DataAxis, Gradients, GradFn, PyTree, Strategy, integers_of_replica_zero,
                                   micro_batches, pmean_floats, reduce_metrics)
from jaxdp.tasks.base import combine


class DataParallel(Strategy):
  """Each replica's gradient sum (over `accum_steps` micro-batches) is summed over replicas by one all-reduce."""

  # `parallel.shard_optimizer_state` (ZeRO-1, this class's subclass) and the device count under it may change on a
  # resume: either layout of the optimizer state is re-laid into the other by ZeRO-1's layout module.
  def stored_opt_layout(self, wanted: PyTree, stored_leaf: Callable[[tuple], Any]) -> PyTree:
    return zero1_layout.stored_layout(wanted, stored_leaf)

  def relayout_opt_state(self, opt_state: PyTree, wanted: PyTree, shardings: PyTree) -> PyTree:
    return zero1_layout.relayout(opt_state, wanted, shardings)

  def gradients(self, grad_fn: GradFn, state: PyTree, batch: dict, rng: jax.Array, axis: DataAxis) -> Gradients:
    metrics, model_state, grads = local_gradients(grad_fn, state, batch, rng, axis, self.options.accum_steps)
    if lax.axis_size(axis.name) == 1:  # One replica: its values are the global ones; no collective at all.
      return metrics, model_state, grads
    # Model state (e.g. BatchNorm running statistics) is averaged too, so the replicas stay identical.
    model_state = pmean_floats(model_state, axis.name)
    if axis.mark_varying:  # Under shard_map the state is one replicated array: an integer leaf must agree too.
      model_state = integers_of_replica_zero(model_state, axis.name)
    return reduce_metrics(metrics, axis.name), model_state, self.reduce(grads, axis)

  def reduce(self, grads: PyTree, axis: DataAxis) -> PyTree:
    """The gradient sum over all replicas: the all-reduce of data parallelism."""
    return all_reduce_sum(grads, axis.name, self.options.allreduce_dtype)


def local_gradients(grad_fn: GradFn, state: PyTree, batch: dict, rng: jax.Array, axis: DataAxis,
                    k: int) -> Gradients:
  """Metric sums (by kind), new model state and gradient sum over this replica's k micro-batches, uncommunicated."""
  # The k sums add up locally (DDP's `no_sync`), so the all-reduce still happens once. Micro-batch i of device d
  # draws its randomness (dropout) from `fold_in(rng, d * k + i)`: its place in the global batch.
  params, first = axis.vary(state.params), lax.axis_index(axis.name) * k
  if k == 1:
    (_, (metrics, model_state)), grads = grad_fn(params, state.model_state, batch, jax.random.fold_in(rng, first))
    return metrics, model_state, grads
  micros = micro_batches(batch, k)
  # The metrics' structure (names by kind), to start their running totals: a max from -inf, the rest from 0.
  shapes = jax.eval_shape(grad_fn, params, state.model_state, jax.tree.map(lambda x: x[0], micros), rng)[0][1][0]

  def micro_step(carry: tuple, xs: tuple) -> tuple:
    model_state, grad_sum, totals = carry
    micro, i = xs
    (_, (metrics, model_state)), grads = grad_fn(params, model_state, micro, jax.random.fold_in(rng, first + i))
    return (model_state, jax.tree.map(jnp.add, grad_sum, grads), combine(totals, metrics)), None  # Sums; maxima of maxima.

  starts = {kind: {name: jnp.float32(-jnp.inf if kind == "max" else 0) for name in names}
            for kind, names in shapes.items()}
  zero_sums = axis.vary((jax.tree.map(jnp.zeros_like, state.params), starts))
  carry = (axis.vary(state.model_state), *zero_sums)
  (model_state, grad_sum, totals), _ = lax.scan(micro_step, carry, (micros, jnp.arange(k)))
  return totals, model_state, grad_sum


def all_reduce_sum(tree: PyTree, axis_name: str, dtype: str = "float32") -> PyTree:
  """`lax.psum` over the axis, communicated in `dtype` (results back in their own dtype)."""
  return jax.tree.map(lambda g: lax.psum(g.astype(dtype), axis_name).astype(g.dtype), tree)
