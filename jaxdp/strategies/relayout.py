"""Optimizer state stored for another device count (ZeRO-1's padded flat leaves) -> this run's layout.

ZeRO-1 keeps every optimizer leaf that mirrors a parameter raveled and zero-padded to a multiple of the
device count N (`zero.flatten`). A checkpoint written on N devices is read with its stored shapes; each
such leaf is cut back to its parameter's shape (`zero.unflatten`) and laid out for this run: padded for
M devices, or in the parameter's shape without ZeRO-1. Elementwise optimizers then resume exactly.
"""

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxdp.strategies import zero
from jaxdp.step import TrainState

PyTree = Any
Path = tuple  # A key path, as jax.tree_util gives it.


def stored_layout(wanted: TrainState, stored_leaf: Callable[[Path], Any]) -> PyTree:
  """`wanted.opt_state` with each parameter mirror shaped as stored; `wanted.opt_state` itself when none differs.

  `stored_leaf(path)` is the stored metadata (shape, dtype) of the opt_state leaf at `path`, or None. A leaf
  keeps its wanted shape when the stored one cannot be re-laid, so that the shape check names it.
  """
  changed = []

  def leaf(path: Path, x: Any, p: Any) -> Any:
    s = stored_leaf(path)
    if s is None or tuple(s.shape) == tuple(x.shape) or not _relayable(s, x, p):
      return x
    changed.append(path)
    return jax.ShapeDtypeStruct(tuple(s.shape), x.dtype)

  laid = _map_mirrors(wanted, lambda path, mirror: jax.tree_util.tree_map_with_path(
      lambda sub, x, p: leaf(path + sub, x, p), mirror, wanted.params))
  return laid if changed else wanted.opt_state


def apply(opt_state: PyTree, wanted: TrainState, num_shards: int, shardings: PyTree) -> PyTree:
  """Restored `opt_state` (stored layout) -> `wanted.opt_state`'s layout, placed with `shardings`."""

  def lay(s: jax.Array, x: Any, p: Any) -> jax.Array:
    if s.shape == x.shape:
      return s
    canonical = s if s.shape == p.shape else zero.unflatten(s, p)
    return canonical if x.shape == p.shape else zero.flatten(canonical, num_shards)

  def relay(source: PyTree) -> PyTree:
    return _map_mirrors(wanted, lambda path, mirror, src: jax.tree.map(lay, src, mirror, wanted.params), source,
                        keep=lambda path, x, src: src)

  return jax.jit(relay, out_shardings=shardings)(opt_state)


def _relayable(stored: Any, wanted: Any, param: Any) -> bool:
  """Whether a stored leaf holds `param`'s values, in its shape or raveled and padded."""
  same_dtype = np.dtype(stored.dtype) == np.dtype(wanted.dtype)
  shape = tuple(stored.shape)
  return same_dtype and (shape == tuple(param.shape) or (len(shape) == 1 and shape[0] >= param.size))


def _map_mirrors(wanted: TrainState, fn: Callable[..., PyTree], *rest: PyTree,
                 keep: Callable[..., Any] = lambda path, x, *rest: x) -> PyTree:
  """`fn(path, subtree, *rest_subtrees)` on each opt_state subtree shaped like the parameters; `keep` elsewhere."""
  params_def = jax.tree.structure(wanted.params)

  def is_mirror(node: Any) -> bool:
    return jax.tree.structure(node) == params_def

  return jax.tree_util.tree_map_with_path(
      lambda path, node, *others: (fn if is_mirror(node) else keep)(path, node, *others), wanted.opt_state, *rest,
      is_leaf=is_mirror)
