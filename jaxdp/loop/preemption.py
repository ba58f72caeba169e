"""Preemption: on SIGTERM or SIGINT, every process finishes the same step, checkpoints it and exits with status 0."""

import os
import signal
import types
from typing import Any

import jax
from jax.experimental import multihost_utils

from jaxdp.loop import hooks

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Watcher:
  """Records a stop signal; `should_stop(step)` is the same decision on every process."""

  def __init__(self) -> None:
    self.requested = False
    # JAX's preemption service (several processes; docs/design-notes.md#preemption-agreement) owns SIGTERM: it
    # installs its handler at `jax.distributed.initialize`, and we forward SIGINT to it as a SIGTERM.
    self.service = jax.process_count() > 1 and bool(jax.config.jax_enable_preemption_service)
    self._previous: dict[int, Any] = {}

  def __enter__(self) -> "Watcher":
    for sig in (signal.SIGINT,) if self.service else SIGNALS:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc: Any) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def _handle(self, signum: int, frame: types.FrameType | None) -> None:
    del frame
    self.requested = True
    signal.signal(signum, self._previous[signum])  # A second signal acts as it would without us.
    if self.service:
      os.kill(os.getpid(), signal.SIGTERM)  # The preemption service's notice; it tells the other processes.

  def should_stop(self, step: int) -> bool:
    """Whether any process was signalled; all processes must stop at the same step. Call it every step."""
    if jax.process_count() == 1:
      return self.requested
    if self.service:  # The service's sync point: the largest step any process reached, plus one.
      return multihost_utils.reached_preemption_sync_point(step)
    return hooks.any_process(self.requested)
