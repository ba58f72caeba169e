"""ZeRO-1's layout (leaves raveled, zero-padded to a multiple of N, P('data')), and a checkpoint's re-laid into it."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

PyTree = Any
Path = tuple  # A key path, as jax.tree_util gives it.
State = Any   # A jaxdp.step.TrainState (abstract or not); not imported, since jaxdp.step imports the strategies.


def flatten(tree: PyTree, n: int) -> PyTree:
  """Each leaf raveled and zero-padded to a multiple of `n` elements."""
  return jax.tree.map(lambda x: jnp.pad(x.reshape(-1), (0, -x.size % n)), tree)


def unflatten(flat: PyTree, like: PyTree) -> PyTree:
  """Inverse of `flatten`: drop the padding, restore each leaf's shape."""
  return jax.tree.map(lambda f, x: f[:x.size].reshape(x.shape), flat, like)


def state_specs(abstract_state: State) -> PyTree:
  """PartitionSpecs of a ZeRO-1 TrainState: opt_state vectors sharded P('data'), all else P()."""
  opt_specs = jax.tree.map(lambda x: P("data") if x.ndim else P(), abstract_state.opt_state)
  everything_replicated = jax.tree.map(lambda _: P(), abstract_state)
  return everything_replicated.replace(opt_state=opt_specs)


def stored_layout(wanted: State, stored_leaf: Callable[[Path], Any]) -> PyTree:
  """`wanted.opt_state` with each parameter mirror shaped as `stored_leaf(path)` says; itself when none differs."""
  changed = []

  def leaf(path: Path, x: Any, p: Any) -> Any:
    s = stored_leaf(path)
    if s is None or tuple(s.shape) == tuple(x.shape) or not _relayable(s, x, p):
      return x  # As wanted: a stored leaf that cannot be re-laid is then named by the checkpoint's shape check.
    changed.append(path)
    return jax.ShapeDtypeStruct(tuple(s.shape), x.dtype)

  laid = _map_mirrors(wanted, lambda path, mirror: jax.tree_util.tree_map_with_path(
      lambda sub, x, p: leaf(path + sub, x, p), mirror, wanted.params))
  return laid if changed else wanted.opt_state


def relayout(opt_state: PyTree, wanted: State, shardings: PyTree) -> PyTree:
  """Restored `opt_state` (stored layout) -> `wanted.opt_state`'s layout, placed with `shardings`."""

  def lay(s: jax.Array, x: Any, p: Any) -> jax.Array:
    if s.shape == x.shape:
      return s
    canonical = s if s.shape == p.shape else unflatten(s, p)
    # A wanted leaf not in its parameter's shape is ZeRO-1's for this run's N: `flatten`'s zero padding.
    return canonical if x.shape == p.shape else jnp.pad(canonical.reshape(-1), (0, x.size - p.size))

  def relay(source: PyTree) -> PyTree:
    return _map_mirrors(wanted, lambda path, mirror, src: jax.tree.map(lay, src, mirror, wanted.params), source,
                        keep=lambda path, x, src: src)

  return jax.jit(relay, out_shardings=shardings)(opt_state)


def _relayable(stored: Any, wanted: Any, param: Any) -> bool:
  """Whether a stored leaf holds `param`'s values, in its shape or raveled and padded."""
  same_dtype = np.dtype(stored.dtype) == np.dtype(wanted.dtype)
  shape = tuple(stored.shape)
  return same_dtype and (shape == tuple(param.shape) or (len(shape) == 1 and shape[0] >= param.size))


def _map_mirrors(wanted: State, fn: Callable[..., PyTree], *rest: PyTree,
                 keep: Callable[..., Any] = lambda path, x, *rest: x) -> PyTree:
  """`fn(path, subtree, *rest_subtrees)` on each opt_state subtree shaped like the parameters; `keep` elsewhere."""
  params_def = jax.tree.structure(wanted.params)

  def is_mirror(node: Any) -> bool:
    return jax.tree.structure(node) == params_def

  return jax.tree_util.tree_map_with_path(
      lambda path, node, *others: (fn if is_mirror(node) else keep)(path, node, *others), wanted.opt_state, *rest,
      is_leaf=is_mirror)
