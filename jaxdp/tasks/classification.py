"""The default task: softmax cross-entropy of the model's logits against integer labels, and accuracy."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxdp.config import ConfigError
from jaxdp.tasks.base import BoundModel


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example softmax cross-entropy with integer labels."""
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)


@dataclasses.dataclass(frozen=True)
class Classification:
  """`model(batch["inputs"])` -> logits vs `batch["labels"]` ([B], or [B, T]: one target per token)."""
  label_smoothing: float = 0.0  # Train loss against (1 - s) one-hot + s / classes; eval loss stays plain.
  headline = ("accuracy",)

  def __post_init__(self) -> None:
    s = self.label_smoothing
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s < 1:
      raise ConfigError(f"task.label_smoothing must be a number in [0, 1), got {s!r}")

  def __call__(self, model: BoundModel, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    logits, labels = model(batch["inputs"]), batch["labels"]
    return self.loss(logits, labels, model.train), self.metrics(logits, labels)

  def loss(self, logits: jax.Array, labels: jax.Array, train: bool) -> jax.Array:
    """Per-target cross-entropy, against labels smoothed (Szegedy et al., 2016) in training only."""
    if not (train and self.label_smoothing):
      return cross_entropy(logits, labels)
    targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), self.label_smoothing)
    return optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)

  def metrics(self, logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
    """Per-target metrics of the logits."""
    return {"accuracy": jnp.argmax(logits, -1) == labels}

  def num_outputs(self, facts: Any) -> int:
    """The model's output width: one logit per class."""
    return int(facts.num_classes)
