"""ZeRO-1: the optimizer state sharded over the data axis (mesh backend).

Each parameter leaf is flattened and padded to a multiple of N (devices); device i owns slice i of
every leaf's optimizer state. A step reduce-scatters the gradients (each device receives the mean of
its slice only), updates its slice of the parameters with its slice of the optimizer state, and
all-gathers the new parameters. Elementwise optimizers (SGD, momentum, Adam, AdamW) give the same
result as unsharded training; per-device optimizer memory drops from 2P to 2P/N for Adam.
"""

from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

PyTree = Any


def _chunk(size: int, n: int) -> int:
  return -(-size // n)  # ceil(size / n)


def flatten(tree: PyTree, n: int) -> PyTree:
  """Each leaf raveled and zero-padded to a multiple of `n` elements."""
  return jax.tree.map(lambda x: jnp.pad(x.reshape(-1), (0, _chunk(x.size, n) * n - x.size)), tree)


def unflatten(flat: PyTree, like: PyTree) -> PyTree:
  """Inverse of `flatten`: drop the padding, restore each leaf's shape."""
  return jax.tree.map(lambda f, x: f[:x.size].reshape(x.shape), flat, like)


def state_specs(abstract_state: Any) -> Any:
  """PartitionSpecs of a ZeRO-1 TrainState: opt_state vectors sharded P('data'), all else P()."""
  opt_specs = jax.tree.map(lambda x: P("data") if x.ndim else P(), abstract_state.opt_state)
  everything_replicated = jax.tree.map(lambda _: P(), abstract_state)
  return everything_replicated.replace(opt_state=opt_specs)


def reduce_gradients(grads: PyTree, loss: jax.Array, *, axis: Any, options: Any) -> tuple[PyTree, jax.Array]:
  """Reduce-scatter: this device's slice of the mean gradient, and whether all slices are finite."""
  n = options.num_shards
  sums = jax.tree.map(lambda g: lax.psum_scatter(g.astype(options.allreduce_dtype), axis.name, tiled=True),
                      flatten(grads, n))
  grad_shard = jax.tree.map(lambda s: s.astype(jnp.float32) / n, sums)
  # Every device checked only its slice: agree collectively, so all skip (or apply) together.
  local_ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves((loss, grad_shard))]))
  return grad_shard, lax.pmin(local_ok.astype(jnp.int32), axis.name).astype(bool)


def update(state: Any, grad_shard: PyTree, *, tx: optax.GradientTransformation, axis: Any,
           options: Any) -> tuple[PyTree, PyTree]:
  """Update the local shard of the parameters with the local optimizer state, then all-gather them."""
  n, me = options.num_shards, lax.axis_index(axis.name)
  param_shard = jax.tree.map(lambda p: lax.dynamic_slice_in_dim(p, me * (p.size // n), p.size // n),
                             flatten(state.params, n))
  updates, opt_state = tx.update(grad_shard, state.opt_state, param_shard)
  new_shard = optax.apply_updates(param_shard, updates)
  return unflatten(lax.all_gather(new_shard, axis.name, tiled=True), state.params), opt_state
