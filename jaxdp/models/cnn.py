"""A small convolutional network (NNX) for small images such as 8x8 digits or 28x28 MNIST."""

from collections.abc import Sequence

import jax
from flax import nnx


class CNN(nnx.Module):
  """3x3 conv blocks, one 2x2 average pool, a dense layer, then logits."""

  def __init__(self, input_shape: Sequence[int], num_classes: int, features: Sequence[int] = (32, 64),
               dense: int = 128, *, rngs: nnx.Rngs):
    height, width, channels = input_shape
    chans = [channels, *features]
    self.convs = nnx.List([nnx.Conv(a, b, (3, 3), rngs=rngs) for a, b in zip(chans, chans[1:])])
    self.dense = nnx.Linear((height // 2) * (width // 2) * chans[-1], dense, rngs=rngs)
    self.head = nnx.Linear(dense, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    for conv in self.convs:
      x = nnx.relu(conv(x))
    x = nnx.avg_pool(x, (2, 2), strides=(2, 2))
    x = nnx.relu(self.dense(x.reshape(x.shape[0], -1)))
    return self.head(x)
