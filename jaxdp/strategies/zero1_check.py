"""Whether ZeRO-1 can run an optimizer: docs/design-notes.md#zero-1-needs-an-elementwise-optimizer"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp.strategies import zero1_layout as layout
from jaxdp.strategies.base import PyTree

_SCALES = (1e-3, 1.0, 1e3)  # Gradient sizes probed: a threshold (a clip's max_norm) acts at one of them at least.
_STEPS = 2                  # Updates probed at each scale: the second one reads the state the first wrote.


def refusal(tx: optax.GradientTransformation, params: PyTree, n: int) -> str | None:
  """Why `tx` cannot run sharded over `n` devices ("its state depends on ..."), or None; `params` may be abstract."""
  try:
    return _state_refusal(tx, params, n) or _update_refusal(tx, params, n)
  except Exception as e:  # An optimizer that needs more than (updates, state, params) cannot be shown elementwise.
    return f"it could not be probed on a small tree ({type(e).__name__}: {e})"


def _state_refusal(tx: optax.GradientTransformation, params: PyTree, n: int) -> str | None:
  """A reason when the state for raveled leaves is not the raveled state of the true shapes (abstract only)."""
  abstract = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
  whole, flat = jax.eval_shape(tx.init, abstract), jax.eval_shape(tx.init, jax.eval_shape(
      lambda t: layout.flatten(t, n), abstract))
  if jax.tree.structure(whole) != jax.tree.structure(flat):
    return "its state's structure depends on the parameters' shapes"
  for w, f in zip(jax.tree.leaves(whole), jax.tree.leaves(flat)):
    if tuple(w.shape) != tuple(f.shape) and tuple(f.shape) != (math.ceil(w.size / n) * n,):
      return f"its state holds a {list(w.shape)} array that the parameters' shapes decide (factored moments?)"
  return None


def _update_refusal(tx: optax.GradientTransformation, params: PyTree, n: int) -> str | None:
  """A reason when updating `n` slices apart differs from updating the whole, on a small tree of the same ranks."""
  shapes = [tuple(min(d, 3) for d in p.shape) for p in jax.tree.leaves(params)]
  rng = np.random.default_rng(0)
  small = lambda scale: jax.tree.unflatten(jax.tree.structure(params), [  # noqa: E731
      jnp.asarray(rng.standard_normal(s) * scale, jnp.float32) for s in shapes])
  value = small(1.0)
  slices = lambda t: jax.tree.map(lambda x: x.reshape(n, -1), layout.flatten(t, n))  # noqa: E731
  whole_state, sliced_state = tx.init(value), jax.vmap(tx.init)(slices(value))
  whole_step, sliced_step = jax.jit(tx.update), jax.jit(jax.vmap(tx.update))
  for scale in _SCALES:
    for _ in range(_STEPS):
      grads = small(scale)
      whole, whole_state = whole_step(grads, whole_state, value)
      parts, sliced_state = sliced_step(slices(grads), sliced_state, slices(value))
      apart = layout.unflatten(jax.tree.map(lambda x: x.reshape(-1), parts), whole)
      if not all(np.allclose(a, w, rtol=1e-5, atol=1e-7 * scale) for a, w in
                 zip(jax.tree.leaves(apart), jax.tree.leaves(whole))):
        return "its update of an element reads other elements (a global-norm clip: use config.max_grad_norm)"
  return None
