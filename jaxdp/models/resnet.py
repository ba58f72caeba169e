"""ResNet (NNX) with BatchNorm synchronized across replicas: ResNet-18 for 32x32 CIFAR by default, or ResNet-50."""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxdp.config import ConfigError

STEMS = ("cifar", "imagenet")


def _batch_norm(features: int, axis_name: str | None, momentum: float, rngs: nnx.Rngs,
                zero_scale: bool = False) -> nnx.BatchNorm:
  """BatchNorm whose batch statistics are averaged over `axis_name` (the data axis) in training."""
  scale_init = nnx.initializers.zeros if zero_scale else nnx.initializers.ones
  return nnx.BatchNorm(features, momentum=momentum, epsilon=1e-5, axis_name=axis_name, scale_init=scale_init,
                       rngs=rngs)


class BasicBlock(nnx.Module):
  """Two 3x3 convolutions with a residual connection (projected when the shape changes)."""

  def __init__(self, in_features: int, features: int, stride: int, axis_name: str | None, momentum: float,
               *, rngs: nnx.Rngs):
    self.conv1 = nnx.Conv(in_features, features, (3, 3), strides=stride, use_bias=False, rngs=rngs)
    self.bn1 = _batch_norm(features, axis_name, momentum, rngs)
    self.conv2 = nnx.Conv(features, features, (3, 3), use_bias=False, rngs=rngs)
    # Zero-initialised last scale: each block starts as the identity, which helps large-batch training.
    self.bn2 = _batch_norm(features, axis_name, momentum, rngs, zero_scale=True)
    reshape = stride != 1 or in_features != features
    self.project = nnx.Conv(in_features, features, (1, 1), strides=stride, use_bias=False,
                            rngs=rngs) if reshape else None
    self.project_bn = _batch_norm(features, axis_name, momentum, rngs) if reshape else None

  def __call__(self, x: jax.Array) -> jax.Array:
    y = nnx.relu(self.bn1(self.conv1(x)))
    y = self.bn2(self.conv2(y))
    shortcut = x if self.project is None else self.project_bn(self.project(x))
    return nnx.relu(y + shortcut)


class Bottleneck(nnx.Module):
  """1x1 (reduce), 3x3 (stride: ResNet v1.5), 1x1 (expand 4x) convolutions with a residual connection."""

  expansion = 4

  def __init__(self, in_features: int, features: int, stride: int, axis_name: str | None, momentum: float,
               *, rngs: nnx.Rngs):
    out = features * self.expansion
    self.conv1 = nnx.Conv(in_features, features, (1, 1), use_bias=False, rngs=rngs)
    self.bn1 = _batch_norm(features, axis_name, momentum, rngs)
    self.conv2 = nnx.Conv(features, features, (3, 3), strides=stride, use_bias=False, rngs=rngs)
    self.bn2 = _batch_norm(features, axis_name, momentum, rngs)
    self.conv3 = nnx.Conv(features, out, (1, 1), use_bias=False, rngs=rngs)
    self.bn3 = _batch_norm(out, axis_name, momentum, rngs, zero_scale=True)  # Each block starts as the identity.
    reshape = stride != 1 or in_features != out
    self.project = nnx.Conv(in_features, out, (1, 1), strides=stride, use_bias=False, rngs=rngs) if reshape else None
    self.project_bn = _batch_norm(out, axis_name, momentum, rngs) if reshape else None

  def __call__(self, x: jax.Array) -> jax.Array:
    y = nnx.relu(self.bn1(self.conv1(x)))
    y = nnx.relu(self.bn2(self.conv2(y)))
    y = self.bn3(self.conv3(y))
    shortcut = x if self.project is None else self.project_bn(self.project(x))
    return nnx.relu(y + shortcut)


BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


class ResNet(nnx.Module):
  """ResNet of basic or bottleneck blocks; ResNet-50 v1.5 is `stage_sizes=(3, 4, 6, 3)`, bottleneck, imagenet stem."""

  def __init__(self, input_shape: Sequence[int], num_classes: int, stage_sizes: Sequence[int] = (2, 2, 2, 2),
               width: int = 64, bn_axis_name: str | None = "data", bn_momentum: float = 0.9,
               stem: str = "cifar", block: str = "basic", *, rngs: nnx.Rngs):
    """`bn_axis_name`: the axis batch statistics are averaged over (None: each replica's own; the running averages
    are averaged over replicas by the step either way). `stem`: "cifar" (3x3, stride 1) or "imagenet" (7x7, stride 2,
    then a 3x3 max-pool, stride 2)."""
    if stem not in STEMS:
      raise ConfigError(f"unknown model stem {stem!r} (choose from {', '.join(STEMS)})")
    if block not in BLOCKS:
      raise ConfigError(f"unknown model block {block!r} (choose from {', '.join(BLOCKS)})")
    block_cls = BLOCKS[block]
    channels, self.pool = input_shape[-1], stem == "imagenet"
    kernel, stride = ((7, 7), 2) if self.pool else ((3, 3), 1)
    self.stem = nnx.Conv(channels, width, kernel, strides=stride, use_bias=False, rngs=rngs)
    self.stem_bn = _batch_norm(width, bn_axis_name, bn_momentum, rngs)
    blocks, features = [], width
    for i, size in enumerate(stage_sizes):
      for j in range(size):
        stride = 2 if i > 0 and j == 0 else 1
        blocks.append(block_cls(features, width * 2**i, stride, bn_axis_name, bn_momentum, rngs=rngs))
        features = width * 2**i * getattr(block_cls, "expansion", 1)
    self.blocks = nnx.List(blocks)
    self.head = nnx.Linear(features, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = nnx.relu(self.stem_bn(self.stem(x)))
    if self.pool:
      x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    for block in self.blocks:
      x = block(x)
    return self.head(jnp.mean(x, axis=(1, 2)))
