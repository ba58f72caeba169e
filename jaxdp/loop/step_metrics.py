"""Each step's train metrics, kept on the device until a log step, and the NaN guard that reads them."""

import logging
from collections.abc import Callable

import numpy as np

from jaxdp import parallel
from jaxdp.report import metrics

log = logging.getLogger("jaxdp")
# Consecutive NaN/Inf steps (each skipped) that stop a run: a few in a row can be bad batches, more mean the
# training diverged and every further step would be skipped too.
MAX_CONSECUTIVE_NONFINITE = 5
IDS_NAMED = 64  # A skipped batch's example ids the error names (the log names them all).


class NonFiniteError(RuntimeError):
  """The loss or gradients stayed NaN/Inf for too many consecutive steps."""


class StepMetrics:
  """Each step's metrics kept on the device until a log step fetches them at once (the host never waits to log a
  step); MAX_CONSECUTIVE_NONFINITE NaN/Inf steps in a row raise NonFiniteError when fetched."""
  FETCH_EVERY = 256  # Without log steps, metrics are still fetched this often (bounded memory, NaN guard).

  def __init__(self, backend: parallel.Backend, ids: Callable[[int], np.ndarray | None] = lambda step: None):
    self.backend = backend
    self.ids = ids  # Step -> its global batch's example ids (positions in the split), read only for a skipped step.
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
      if host["nonfinite"]:  # Which rows fed it: NaN inputs are found by their ids (jaxdp.audit's).
        log.warning("step %d: loss or gradients NaN/Inf, update skipped; its batch's example ids: %s", step,
                    _named(self.ids(step), None))
      if len(self.nonfinite_run) >= MAX_CONSECUTIVE_NONFINITE:
        batches = "; ".join(f"step {s}: {_named(self.ids(s), IDS_NAMED)}" for s in self.nonfinite_run)
        raise NonFiniteError(f"loss or gradients were NaN/Inf for {len(self.nonfinite_run)} consecutive steps "
                             f"({self.nonfinite_run[0]}..{step}); those updates were skipped and training "
                             f"stopped; the last checkpoint is intact; the skipped batches' example ids (positions "
                             f"in the train split): {batches}")


def _named(ids: np.ndarray | None, limit: int | None) -> str:
  """A batch's example ids as text, sorted (the first `limit`, and how many more); "unknown" without them."""
  if ids is None:
    return "unknown"
  ids = np.sort(np.asarray(ids).reshape(-1))
  shown = ", ".join(str(i) for i in ids[:limit])
  return shown + (f", ... ({len(ids) - limit} more: the log names them)" if limit and len(ids) > limit else "")

