"""Regression on float targets of any shape: MSE loss; MSE, MAE and R² metrics."""

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp.tasks.base import BoundModel


@dataclasses.dataclass(frozen=True)
class Regression:
  """`model(batch["inputs"])`, reshaped to `batch["labels"]`' shape, against those float targets, per element."""
  # R²'s variance is taken about this point: near the targets' mean, E[(y-c)²] - E[y-c]² keeps float32's digits
  # where E[y²] - E[y]² cancels them. None: 0, unless the build sets it from the data's targets (`centered`).
  center: float | None = None
  headline = ("mse",)

  def __call__(self, model: BoundModel, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    y = batch["labels"].astype(jnp.float32)
    error = model(batch["inputs"]).astype(jnp.float32).reshape(y.shape) - y
    squared = jnp.square(error)
    shifted = y - jnp.float32(self.center or 0.0)
    # R² needs the targets' variance, from the reduced means of y - c and (y - c)² ("_": not reported).
    return squared, {"mse": squared, "mae": jnp.abs(error), "_y": shifted, "_y2": jnp.square(shifted)}

  def centered(self, targets: np.ndarray) -> "Regression":
    """This task centered at the mean of the finite `targets` (float64; 0 for none), rounded to float32 as used."""
    finite = np.asarray(targets, np.float64)[np.isfinite(targets)]
    mean = float(finite.mean()) if finite.size else 0.0
    return dataclasses.replace(self, center=float(np.float32(mean)))

  def num_outputs(self, facts: Any) -> int:
    """One output per target element."""
    return math.prod(facts.label_shape) or 1

  def finalize(self, scalars: dict[str, float]) -> dict[str, float]:
    """R² = 1 - MSE / Var(y) over every target element."""
    variance = scalars["_y2"] - scalars["_y"] ** 2
    return {"r2": 1.0 - scalars["mse"] / variance if variance > 0 else float("nan")}
