"""An NNX model with integer state: a counter of its training calls beside a float running mean."""

import jax
import jax.numpy as jnp
from flax import nnx


class CountingNNX(nnx.Module):
  """Linear over flattened inputs; `calls` (int32) adds 1 per call, `mean` tracks the inputs' mean."""

  def __init__(self, in_features: int = 64, num_classes: int = 10, *, rngs: nnx.Rngs):
    self.linear = nnx.Linear(in_features, num_classes, rngs=rngs)
    self.calls = nnx.BatchStat(jnp.zeros((), jnp.int32))
    self.mean = nnx.BatchStat(jnp.zeros((), jnp.float32))

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.reshape(x.shape[0], -1)
    self.calls[...] = self.calls[...] + 1  # Eval's new model state is dropped: only training calls stay.
    self.mean[...] = 0.9 * self.mean[...] + 0.1 * jnp.mean(x.astype(jnp.float32))
    return self.linear(x)
