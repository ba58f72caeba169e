"""What "two trainings are the same" means where their sums round in another order: N processes against one.

The whole parameter tree within a relative L2 distance that float32 rounding explains, and each element that is not
near zero within a relative tolerance. Near zero, a difference of rounding is a large relative one (a weight of
-0.0088 off in its fourth digit) and says nothing about the training. Bitwise promises use `runs.assert_bitwise`.
"""

from typing import Any

import jax
import numpy as np

# Float32 sums taken in another order, over the suite's runs of a few dozen steps: the bound the suite holds one
# device against eight to (test_library), far under what a different training moves (test_same_training).
REL_L2 = 1e-5
# An element is compared on its own where its magnitude is at least this share of its leaf's root mean square.
NEAR_ZERO = 0.5
RTOL = 1e-4  # Of such an element.


def distance(got: Any, want: Any) -> float:
  """||got - want|| / ||want|| over the whole tree (every leaf together), in float64."""
  flat = [np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(t)]) for t in (got, want)]
  return float(np.linalg.norm(flat[0] - flat[1]) / np.linalg.norm(flat[1]))


def assert_same_training(got: Any, want: Any, rel_l2: float = REL_L2, rtol: float = RTOL,
                         near_zero: float = NEAR_ZERO) -> None:
  """`got` trained as `want` did: the same tree, within `rel_l2` of it, and each element not near zero (at least
  `near_zero` of its leaf's root mean square in `want`) within `rtol` of `want`'s."""
  assert jax.tree.structure(got) == jax.tree.structure(want)
  apart = distance(got, want)
  assert apart <= rel_l2, f"the trees' relative L2 distance is {apart:.3g}, over {rel_l2:g}"
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, jax.tree_util.keystr(path)
    far = np.abs(b) >= near_zero * np.sqrt(np.mean(np.square(b)))
    np.testing.assert_allclose(a[far], b[far], rtol=rtol, atol=0, err_msg=jax.tree_util.keystr(path))
