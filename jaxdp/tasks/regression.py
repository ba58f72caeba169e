"""Regression on float targets of any shape: MSE loss; MSE, MAE and R² metrics."""

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxdp.tasks.base import BoundModel


@dataclasses.dataclass(frozen=True)
class Regression:
  """`model(batch["inputs"])`, reshaped to `batch["labels"]`' shape, against those float targets, per element."""
  headline = ("mse",)

  def __call__(self, model: BoundModel, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    y = batch["labels"].astype(jnp.float32)
    error = model(batch["inputs"]).astype(jnp.float32).reshape(y.shape) - y
    squared = jnp.square(error)
    # R² needs the targets' variance: E[y²] - E[y]², from the reduced means of y and y² ("_": not reported).
    return squared, {"mse": squared, "mae": jnp.abs(error), "_y": y, "_y2": jnp.square(y)}

  def num_outputs(self, facts: Any) -> int:
    """One output per target element."""
    return math.prod(facts.label_shape) or 1

  def finalize(self, scalars: dict[str, float]) -> dict[str, float]:
    """R² = 1 - MSE / Var(y) over every target element."""
    variance = scalars["_y2"] - scalars["_y"] ** 2
    return {"r2": 1.0 - scalars["mse"] / variance if variance > 0 else float("nan")}
