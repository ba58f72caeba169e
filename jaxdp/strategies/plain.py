"""Plain data parallelism (PyTorch DDP): local gradients, one all-reduce of their mean, the same update everywhere."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdp.strategies.base import (DataAxis, Gradients, GradFn, PyTree, Scalars, Strategy, integers_of_replica_zero,
                                   micro_batches, pmean_floats, reduce_metrics)
from jaxdp.tasks.base import combine


class DataParallel(Strategy):
  """Each replica's gradient (accumulated over `accum_steps` micro-batches) is averaged by one all-reduce."""

  def gradients(self, grad_fn: GradFn, state: PyTree, batch: dict, rng: jax.Array, axis: DataAxis) -> Gradients:
    metrics, model_state, grads = local_gradients(grad_fn, state, batch, rng, axis, self.options.accum_steps)
    if lax.axis_size(axis.name) == 1:  # One replica: its values are the global ones; no collective at all.
      return metrics, model_state, grads
    # Model state (e.g. BatchNorm running statistics) is averaged too, so the replicas stay identical.
    model_state = pmean_floats(model_state, axis.name)
    if axis.mark_varying:  # Under shard_map the state is one replicated array: an integer leaf must agree too.
      model_state = integers_of_replica_zero(model_state, axis.name)
    # Flat only where `reduce` is this class's all-reduce (ZeRO-1 overrides it with a reduce-scatter).
    if self.options.flat_allreduce and type(self).reduce is DataParallel.reduce:
      metrics, grads = self._flat_reduce(metrics, grads, axis)
      return metrics, model_state, grads
    grads = self.reduce(grads, axis)
    return reduce_metrics(metrics, axis.name), model_state, grads

  def _flat_reduce(self, metrics: Scalars, grads: PyTree, axis: DataAxis) -> tuple[Scalars, PyTree]:
    """Metrics and gradients reduced in as few buffers as `bucket_bytes` allows.

    XLA:CPU runs each operand of a combined all-reduce as its own gloo call with a fixed cost; one
    buffer (or one per bucket, as DDP) pays it once. The mean-kind scalars (the loss among them) ride
    along only in float32, so a bfloat16 all-reduce does not round the reported loss; sums and maxima
    take their own collectives.
    """
    dtype, bucket = self.options.allreduce_dtype, self.options.bucket_bytes
    means, others = metrics["mean"], {**metrics, "mean": {}}
    if jnp.dtype(dtype) != jnp.float32:
      return reduce_metrics(metrics, axis.name), flat_all_reduce_mean(grads, axis.name, dtype, bucket)
    means, grads = flat_all_reduce_mean((means, grads), axis.name, dtype, bucket)
    return {**reduce_metrics(others, axis.name), "mean": means}, grads

  def reduce(self, grads: PyTree, axis: DataAxis) -> PyTree:
    """The mean gradient over all replicas: the all-reduce of data parallelism."""
    return all_reduce_mean(grads, axis.name, self.options.allreduce_dtype)


def local_gradients(grad_fn: GradFn, state: PyTree, batch: dict, rng: jax.Array, axis: DataAxis,
                    k: int) -> Gradients:
  """Metrics (by kind), new model state and mean gradients over this replica's slice, with no communication.

  With k > 1 the slice is cut into k micro-batches, run one after another, and their gradients are
  averaged locally (DDP's `no_sync`): the all-reduce still happens once. Micro-batch i of device d
  draws its randomness (dropout) from `fold_in(rng, d * k + i)`: its place in the global batch.
  """
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
  means = {**totals, "mean": {name: v / k for name, v in totals["mean"].items()}}
  return means, model_state, jax.tree.map(lambda g: g / k, grad_sum)


def all_reduce_mean(tree: PyTree, axis_name: str, dtype: str = "float32") -> PyTree:
  """`lax.pmean` over the axis, communicated in `dtype` (results back in their own dtype)."""
  return jax.tree.map(lambda g: lax.pmean(g.astype(dtype), axis_name).astype(g.dtype), tree)


def flat_all_reduce_mean(tree: PyTree, axis_name: str, dtype: str = "float32", bucket_bytes: int = 25 << 20) -> PyTree:
  """`all_reduce_mean` of one flat `dtype` buffer holding every leaf, cut in buckets of at most `bucket_bytes`."""
  leaves, treedef = jax.tree.flatten(tree)
  # Joined as (1, n) rows, which XLA:CPU copies leaf by leaf; a 1-D concatenate of raveled leaves fuses into a
  # loop many times slower (experiments/strategy_notes.md).
  flat = jnp.concatenate([x.astype(dtype).reshape(1, -1) for x in leaves], axis=1).reshape(-1)
  chunk = max(1, bucket_bytes // jnp.dtype(dtype).itemsize)
  pieces = [lax.pmean(flat[i:i + chunk], axis_name) for i in range(0, flat.size, chunk)]
  flat = pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces)
  starts = np.cumsum([0] + [x.size for x in leaves])
  return treedef.unflatten([flat[a:b].reshape(x.shape).astype(x.dtype) for x, a, b in zip(leaves, starts, starts[1:])])
