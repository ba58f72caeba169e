"""Each step's train metrics, kept on the device until a log step, and the NaN guard that reads them."""

import logging

from jaxdp import parallel
from jaxdp.report import metrics

log = logging.getLogger("jaxdp")
# Consecutive NaN/Inf steps (each skipped) that stop a run: a few in a row can be bad batches, more mean the
# training diverged and every further step would be skipped too.
MAX_CONSECUTIVE_NONFINITE = 5


class NonFiniteError(RuntimeError):
  """The loss or gradients stayed NaN/Inf for too many consecutive steps."""


class StepMetrics:
  """Each step's metrics kept on the device until a log step fetches them at once (the host never waits to log a
  step); MAX_CONSECUTIVE_NONFINITE NaN/Inf steps in a row raise NonFiniteError when fetched."""
  FETCH_EVERY = 256  # Without log steps, metrics are still fetched this often (bounded memory, NaN guard).

  def __init__(self, backend: parallel.Backend):
    self.backend = backend
    self.pending: list[tuple[int, dict]] = []  # (step, device metrics), oldest first.
    self.history: list[dict] = []  # Host copies since the last flush.
    self.nonfinite_run: list[int] = []
    self.last_step = 0

  def push(self, step: int, step_metrics: dict) -> None:
    """Takes step `step`'s device metrics."""
    self.pending.append((step, step_metrics))
    if len(self.pending) >= self.FETCH_EVERY:
      self._fetch()

  def flush(self) -> dict[str, float]:
    """Mean train metrics since the last flush (`train/loss`, ...), with the skipped steps counted."""
    self._fetch()
    history, self.history = self.history, []
    out = metrics.mean(history, "train")
    log.debug("step %d: %s", self.last_step, out)  # The progress reporter prints the readable line.
    return out

  def _fetch(self) -> None:
    """Copies the pending steps' metrics to the host (one sync), in step order, checking the NaN run."""
    pending, self.pending = self.pending, []
    for step, host in zip([s for s, _ in pending], self.backend.get([m for _, m in pending])):
      self.history.append(host)
      self.last_step = step
      self.nonfinite_run = self.nonfinite_run + [step] if host["nonfinite"] else []
      if len(self.nonfinite_run) >= MAX_CONSECUTIVE_NONFINITE:
        raise NonFiniteError(f"loss or gradients were NaN/Inf for {len(self.nonfinite_run)} consecutive steps "
                             f"({self.nonfinite_run[0]}..{step}); those updates were skipped and training "
                             "stopped; the last checkpoint is intact")

