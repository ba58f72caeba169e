"""ZeRO-1 (mesh backend): device i owns slice i of every raveled, padded leaf's optimizer state (`zero1_layout`)."""

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxdp.strategies import zero1_layout as layout
from jaxdp.strategies.base import DataAxis, PyTree, all_finite
from jaxdp.strategies.plain import DataParallel


class ZeRO1(DataParallel):
  """Reduce-scatter, update the local optimizer-state shard, all-gather the parameters."""
  flag = "shard_optimizer_state"
  title = "ZeRO-1"
  holds = "optimizer state sharded (ZeRO-1), parameters replicated"
  checked = False  # The step all-gathers the new parameters itself; `grad` then adds no implicit psum.
  shards_state = True

  def init_opt_state(self, tx: optax.GradientTransformation, params: PyTree) -> PyTree:
    return tx.init(layout.flatten(params, self.options.num_shards))

  def state_specs(self, abstract_state: PyTree) -> PyTree:
    return layout.state_specs(abstract_state)

  def reduce(self, grads: PyTree, axis: DataAxis) -> PyTree:
    """Reduce-scatter: this device's slice of the gradient sum (flattened, padded with zeros)."""
    n, dtype = self.options.num_shards, self.options.allreduce_dtype
    sums = jax.tree.map(lambda g: lax.psum_scatter(g.astype(dtype), axis.name, tiled=True), layout.flatten(grads, n))
    return jax.tree.map(lambda s: s.astype(jnp.float32), sums)

  def finite(self, loss: jax.Array, grads: PyTree, axis: DataAxis) -> jax.Array:
    # Every device checked only its slice: agree collectively, so all skip (or apply) together.
    return lax.pmin(all_finite((loss, grads)).astype(jnp.int32), axis.name).astype(bool)

  def global_norm(self, grads: PyTree, axis: DataAxis) -> jax.Array:
    # Each device holds one slice of every leaf; the padding is zero and adds nothing.
    local = sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads))
    return jnp.sqrt(lax.psum(local, axis.name))

  def apply(self, state: PyTree, grads: PyTree, tx: optax.GradientTransformation,
            axis: DataAxis) -> tuple[PyTree, PyTree]:
    n, me = self.options.num_shards, lax.axis_index(axis.name)
    param_shard = jax.tree.map(lambda p: lax.dynamic_slice_in_dim(p, me * (p.size // n), p.size // n),
                               layout.flatten(state.params, n))
    updates, opt_state = tx.update(grads, state.opt_state, param_shard)
    new_shard = optax.apply_updates(param_shard, updates)
    return layout.unflatten(lax.all_gather(new_shard, axis.name, tiled=True), state.params), opt_state
