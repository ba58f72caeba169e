"""A model whose gradient is non-finite in ONE element while its loss stays finite."""

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax


class OneNaNGradient(nnx.Module):
  """Linear model plus a zero `probe` vector; element `index` of the probe's gradient is Inf/NaN.

  sqrt(p - stop_gradient(p)) is 0 in value (the loss is finite) and has an infinite derivative.
  """

  def __init__(self, in_features: int = 64, num_classes: int = 10, size: int = 64, index: int = 13, *,
               rngs: nnx.Rngs):
    self.linear = nnx.Linear(in_features, num_classes, rngs=rngs)
    self.probe = nnx.Param(jnp.zeros((size,)))
    self.index = index

  def __call__(self, x: jax.Array) -> jax.Array:
    p = self.probe[self.index]
    return self.linear(x.reshape(x.shape[0], -1)) + jnp.sqrt(p - lax.stop_gradient(p))
