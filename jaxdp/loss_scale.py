"""Dynamic loss scaling for float16 compute (docs/parallelism.md), as PyTorch's `GradScaler` and jmp do it."""

import jax
import jax.numpy as jnp
from flax import struct

INITIAL_SCALE = 2.0 ** 15  # jmp's and most float16 recipes' start; the first overflows halve it within steps.
GROWTH_INTERVAL = 2000     # PyTorch GradScaler's default: finite steps in a row before the scale doubles.
FACTOR = 2.0               # A power of two: scaling and unscaling are exact.


@struct.dataclass
class LossScale:
  """The current scale and the finite steps in a row since it last changed."""
  scale: jax.Array       # float32 scalar, a power of two >= 1.
  good_steps: jax.Array  # int32 scalar.

  def update(self, finite: jax.Array) -> "LossScale":
    """After a step: halve on a non-finite gradient (never below 1), double after GROWTH_INTERVAL finite steps."""
    grow = finite & (self.good_steps + 1 >= GROWTH_INTERVAL)
    scale = jnp.where(finite, jnp.where(grow, self.scale * FACTOR, self.scale), jnp.maximum(self.scale / FACTOR, 1.0))
    return LossScale(scale=scale, good_steps=jnp.where(finite & ~grow, self.good_steps + 1, 0))


def initial(compute_dtype: str) -> LossScale | None:
  """A fresh scale for float16 compute; None (no scaling) for every other dtype."""
  if jnp.dtype(compute_dtype) != jnp.float16:
    return None
  return LossScale(scale=jnp.float32(INITIAL_SCALE), good_steps=jnp.zeros((), jnp.int32))
