"""Language modelling: classification of every next token, plus bits per byte (the GPT configs' task)."""

import dataclasses
import math

import jax

from jaxdp.tasks.classification import Classification, cross_entropy


@dataclasses.dataclass(frozen=True)
class NextToken(Classification):
  """Per-token cross-entropy and accuracy of `[B, T]` labels; `bits_per_byte` = loss / ln 2 / bytes_per_token."""
  bytes_per_token: float = 1.0  # 1 for byte- or character-level tokens; a BPE vocabulary's mean bytes otherwise.

  def metrics(self, logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
    # The model's code length: plain cross-entropy, even when the train loss is smoothed.
    bits = cross_entropy(logits, labels) / (math.log(2) * self.bytes_per_token)
    return {**super().metrics(logits, labels), "bits_per_byte": bits}
