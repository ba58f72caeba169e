"""`train/learning_rate` of a logged step: the config's schedule, or the rate an optax object's state carries."""

from collections.abc import Callable
from typing import Any

import ml_collections
import numpy as np

from jaxdp import objects, optim

KEY = "train/learning_rate"


class LearningRate:
  """The learning rate of step N's update, read on the host at log steps only (no sync on other steps)."""

  def __init__(self, named: ml_collections.ConfigDict, get: Callable[[Any], Any]):
    """`named`: the config as checkpoints store it (an object passed as the optimizer is "<object ...>")."""
    name = named.optimizer
    self.schedule = optim.schedule(named) if isinstance(name, str) and not name.startswith(
        objects.OBJECT_PREFIX) else None  # The config's own optimizer: its schedule.
    self.get = get

  def __call__(self, step: int, state: Any) -> dict[str, float]:
    """{KEY: the rate of step `step`'s update}, or {} where the optimizer's state carries none."""
    if self.schedule is not None:
      return {KEY: float(self.schedule(step - 1))}  # Update N (1-based) reads the schedule at count N - 1.
    value = optim.injected_learning_rate(state.opt_state)
    return {} if value is None else {KEY: float(np.asarray(self.get(value)))}
