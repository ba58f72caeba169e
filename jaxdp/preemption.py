"""Preemption: on SIGTERM or SIGINT, finish the step, checkpoint it, and exit cleanly (status 0)."""

import signal
import types
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Watcher:
  """Records a stop signal; `should_stop(step)` is the same decision on every process."""

  def __init__(self, sync_every_steps: int = 1):
    self.requested = False
    self.sync_every_steps = sync_every_steps
    self._previous: dict[int, Any] = {}

  def __enter__(self) -> "Watcher":
    for sig in SIGNALS:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc: Any) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def _handle(self, signum: int, frame: types.FrameType | None) -> None:
    del frame
    self.requested = True
    signal.signal(signum, self._previous[signum])  # A second signal acts as it would without us.

  def should_stop(self, step: int) -> bool:
    """Whether any process was signalled; all processes must stop at the same step."""
    if jax.process_count() == 1:
      return self.requested
    if step % self.sync_every_steps:
      return False
    return bool(np.any(multihost_utils.process_allgather(np.array([self.requested]))))
