"""Models a user brings without touching jaxdp: one linen (with BatchNorm state), one NNX."""

import jax
from flax import linen as nn
from flax import nnx


class LinenBNNet(nn.Module):
  """linen: Dense, BatchNorm, ReLU, Dense; takes `train` as the adapter expects."""
  width: int = 32
  num_classes: int = 10

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    x = nn.Dense(self.width)(x.reshape(x.shape[0], -1))
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    return nn.Dense(self.num_classes)(nn.relu(x))


class NNXNet(nnx.Module):
  """NNX: a linear model over flattened 8x8 inputs; its sizes come from the config."""

  def __init__(self, in_features: int, num_classes: int, *, rngs: nnx.Rngs):
    self.linear = nnx.Linear(in_features, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.linear(x.reshape(x.shape[0], -1))


class PoisonNNX(nnx.Module):
  """NNX linear model whose loss is NaN when `poison` is set: plants non-finite gradients."""

  def __init__(self, in_features: int = 64, num_classes: int = 10, poison: bool = False, *, rngs: nnx.Rngs):
    self.linear = nnx.Linear(in_features, num_classes, rngs=rngs)
    self.poison = poison

  def __call__(self, x: jax.Array) -> jax.Array:
    logits = self.linear(x.reshape(x.shape[0], -1))
    return logits * float("nan") if self.poison else logits


class ConvNNX(nnx.Module):
  """NNX: two convolutions from a 2-channel image to one value per pixel, with dropout between them."""

  def __init__(self, rngs: nnx.Rngs):
    self.conv1 = nnx.Conv(2, 8, (3, 3), rngs=rngs)
    self.dropout = nnx.Dropout(0.1, rngs=rngs)
    self.conv2 = nnx.Conv(8, 1, (3, 3), rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.conv2(self.dropout(nnx.relu(self.conv1(x))))


class ConvDenseNNX(nnx.Module):
  """NNX: a dense layer over each pixel's channels, then a convolution to one value per pixel."""

  def __init__(self, rngs: nnx.Rngs):
    self.dense = nnx.Linear(2, 8, rngs=rngs)
    self.conv = nnx.Conv(8, 1, (3, 3), rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.conv(nnx.relu(self.dense(x)))
