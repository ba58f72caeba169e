"""An NNX model with dropout: its `nnx.Rngs` stream state (typed PRNG keys) travels in the checkpoint."""

import jax
from flax import nnx


class DropoutNNX(nnx.Module):
  """Linear, dropout, linear over flattened inputs; the dropout keys come from the module's Rngs."""

  def __init__(self, in_features: int = 64, num_classes: int = 10, width: int = 16, *, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(in_features, width, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)
    self.out = nnx.Linear(width, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.out(self.dropout(nnx.relu(self.hidden(x.reshape(x.shape[0], -1)))))
