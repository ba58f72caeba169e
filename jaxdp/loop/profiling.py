"""`config.profile_steps=(first, last)`: process 0's `jax.profiler` trace of those steps (TensorBoard, Perfetto)."""

from typing import Any

import jax

from jaxdp.config import ConfigError


class Profiler:
  """Starts the trace before step `first` is dispatched and stops it once step `last` has finished."""

  def __init__(self, workdir: str, steps: Any):
    self.workdir = workdir
    self.first, self.last = parse_steps(steps)
    self.enabled = self.first > 0 and jax.process_index() == 0
    self.active = False

  def before(self, step: int) -> None:
    """Called before step `step` is dispatched."""
    if self.enabled and step == self.first:
      jax.profiler.start_trace(self.workdir)  # Writes WORKDIR/plugins/profile/<timestamp>/.
      self.active = True

  def after(self, step: int, state: Any) -> None:
    """Called after step `step` was dispatched: the trace ends when it has run."""
    if self.active and step >= self.last:
      self.stop(state)

  def stop(self, state: Any = None) -> None:
    """Ends the trace (also when the run stops inside the profiled steps)."""
    if self.active:
      jax.block_until_ready(state)
      jax.profiler.stop_trace()
      self.active = False


def parse_steps(steps: Any) -> tuple[int, int]:
  """`()` or `(first, last)` with 1 <= first <= last -> (first, last); (0, 0) when off."""
  if steps is None or (isinstance(steps, (tuple, list)) and not steps):
    return 0, 0
  if (isinstance(steps, (tuple, list)) and len(steps) == 2 and all(isinstance(s, int) for s in steps)
      and 1 <= steps[0] <= steps[1]):
    return int(steps[0]), int(steps[1])
  raise ConfigError(f"profile_steps must be () or (first, last) with 1 <= first <= last, got {steps!r}")
