"""Tasks a user brings, named "my_tasks:focal" (not jaxdp's): a custom loss and metrics of every kind."""

import jax
import jax.numpy as jnp

from jaxdp.tasks import Classification, Metric


def focal(model, batch: dict[str, jax.Array], gamma: float = 2.0) -> tuple[jax.Array, dict]:
  """Focal loss (Lin et al., 2017): cross-entropy scaled by (1 - p)^gamma; gamma 0 is plain cross-entropy."""
  logits, labels = model(batch["inputs"]).astype(jnp.float32), batch["labels"]
  log_p = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1)[:, 0]
  p = jnp.exp(log_p)
  correct = jnp.argmax(logits, -1) == labels
  return -((1 - p) ** gamma) * log_p, {
      "confidence": p,                                      # Mean probability of the true class.
      "worst": Metric(-log_p, reduce="max"),                # The largest cross-entropy of any example.
      "hits": Metric(correct, reduce="sum"),                # Correct predictions, counted.
      "even_accuracy": Metric(correct, weights=labels % 2 == 0),  # Accuracy over even classes only.
  }


focal.headline = ("confidence",)


class Scaled:
  """A task class: cross-entropy times `scale`, and the mean logit norm."""

  def __init__(self, scale: float = 1.0):
    self.scale = scale

  def __call__(self, model, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict]:
    logits = model(batch["inputs"]).astype(jnp.float32)
    ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["labels"][:, None], -1)[:, 0]
    return self.scale * ce, {"logit_norm": jnp.linalg.norm(logits, axis=-1)}


def loose(model, batch: dict[str, jax.Array], **options: float) -> tuple[jax.Array, dict]:
  """A task taking any field (`**options`): cross-entropy times `options["scale"]`, each option reported."""
  logits = model(batch["inputs"]).astype(jnp.float32)
  ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["labels"][:, None], -1)[:, 0]
  return options.get("scale", 1.0) * ce, {k: jnp.full(ce.shape, v) for k, v in options.items()}


def smoothed(model, batch: dict[str, jax.Array], label_smoothing: float = 0.0) -> tuple[jax.Array, dict]:
  """A function with a `label_smoothing` field of its own: it reports the value it was given."""
  logits = model(batch["inputs"]).astype(jnp.float32)
  ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["labels"][:, None], -1)[:, 0]
  return ce, {"smoothing": jnp.full(ce.shape, label_smoothing)}


class MyClassification(Classification):
  """A user's subclass of the built-in classification task."""
