"""Models with dropout (NNX and linen) for the randomness tests; the Mask* models record their mask."""

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

MASK_WIDTH = 32


class DropoutMLP(nnx.Module):
  """NNX: Linear, ReLU, Dropout, Linear over flattened inputs."""

  def __init__(self, in_features: int = 64, num_classes: int = 10, width: int = 32, rate: float = 0.3, *,
               rngs: nnx.Rngs):
    self.hidden = nnx.Linear(in_features, width, rngs=rngs)
    self.dropout = nnx.Dropout(rate, rngs=rngs)
    self.out = nnx.Linear(width, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.out(self.dropout(nnx.relu(self.hidden(x.reshape(x.shape[0], -1)))))


class DropoutMLPLinen(nn.Module):
  """linen: the same network."""
  width: int = 32
  num_classes: int = 10
  rate: float = 0.3

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    x = nn.relu(nn.Dense(self.width)(x.reshape(x.shape[0], -1)))
    return nn.Dense(self.num_classes)(nn.Dropout(self.rate, deterministic=not train)(x))


class MaskNNX(nnx.Module):
  """NNX linear model that keeps the dropout mask it drew last (int32, so no replica averages it)."""

  def __init__(self, in_features: int = 64, num_classes: int = 10, *, rngs: nnx.Rngs):
    self.linear = nnx.Linear(in_features, num_classes, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)
    self.mask = nnx.BatchStat(jnp.zeros((MASK_WIDTH,), jnp.int32))

  def __call__(self, x: jax.Array) -> jax.Array:
    self.mask[...] = (self.dropout(jnp.ones((MASK_WIDTH,))) > 0).astype(jnp.int32)
    return self.linear(x.reshape(x.shape[0], -1))


class MaskLinen(nn.Module):
  """linen: the same, the mask in a 'masks' collection."""
  num_classes: int = 10

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    mask = self.variable("masks", "mask", jnp.zeros, (MASK_WIDTH,), jnp.int32)
    if train:
      mask.value = (nn.Dropout(0.5, deterministic=False)(jnp.ones((MASK_WIDTH,))) > 0).astype(jnp.int32)
    return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))
