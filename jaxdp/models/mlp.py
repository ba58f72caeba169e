"""A multi-layer perceptron (NNX)."""

from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx


class MLP(nnx.Module):
  """Flatten, then ReLU hidden layers, then logits."""

  def __init__(self, input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (256, 256), *,
               rngs: nnx.Rngs):
    widths = [int(np.prod(input_shape)), *hidden]
    self.hidden = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths, widths[1:])])
    self.head = nnx.Linear(widths[-1], num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.reshape(x.shape[0], -1)
    for layer in self.hidden:
      x = nnx.relu(layer(x))
    return self.head(x)
