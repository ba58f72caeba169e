"""ZeRO-1's layout: each parameter leaf raveled and zero-padded to a multiple of N, sharded P('data').

The strategy that uses it is `jaxdp.strategies.zero1.ZeRO1`; checkpoints re-lay optimizer state for
another device count with `flatten` / `unflatten`.
"""

from typing import Any

import jax
import jax.numpy as jnp
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
