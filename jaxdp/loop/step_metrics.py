"""Each step's train metrics, kept on the device until a log step, and the NaN guard that reads them.

`StepMetrics` does two jobs that share one fetch: it averages the metrics of the steps between log steps
(`train/loss`, ...), and it is the non-finite guard, raising `NonFiniteError` after a run of consecutive
NaN/Inf steps (each of which the step itself skipped). It also bounds the steps in flight on CPU.
"""

import logging

import jax

from jaxdp import parallel
from jaxdp.report import metrics

log = logging.getLogger("jaxdp")
# Unfinished steps on CPU before the host waits for the oldest. Why: docs/design-notes.md#steps-in-flight
MAX_STEPS_IN_FLIGHT = 2
# Consecutive NaN/Inf steps (each skipped) that stop a run: a few in a row can be bad batches, more mean the
# training diverged and every further step would be skipped too.
MAX_CONSECUTIVE_NONFINITE = 5


class NonFiniteError(RuntimeError):
  """The loss or gradients stayed NaN/Inf for too many consecutive steps."""


class StepMetrics:
  """Keeps each step's metrics on the device until a log step fetches them all at once; the NaN/Inf guard.

  The host never waits for a step in order to log it. It waits only for the step `max_in_flight` steps
  back when that bound is set (fake CPU devices deadlock without one), and copies nothing to do so.
  A run of MAX_CONSECUTIVE_NONFINITE consecutive NaN/Inf steps raises NonFiniteError when the metrics are fetched:
  at the next log step, or after FETCH_EVERY steps, whichever comes first.
  """
  FETCH_EVERY = 256  # Without log steps, metrics are still fetched this often (bounded memory, NaN guard).

  def __init__(self, backend: parallel.Backend, max_in_flight: int):
    self.backend, self.max_in_flight = backend, max_in_flight
    self.pending: list[tuple[int, dict]] = []  # (step, device metrics), oldest first.
    self.finished = 0  # pending[:finished] are known to have run.
    self.history: list[dict] = []  # Host copies since the last flush.
    self.nonfinite_run: list[int] = []
    self.last_step = 0

  def push(self, step: int, step_metrics: dict) -> None:
    """Takes step `step`'s device metrics; waits for an older step when too many are in flight."""
    self.pending.append((step, step_metrics))
    while self.max_in_flight and len(self.pending) - self.finished > self.max_in_flight:
      jax.block_until_ready(self.pending[self.finished][1]["nonfinite"])  # A tiny output; nothing copied.
      self.finished += 1
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
    pending, self.pending, self.finished = self.pending, [], 0
    for step, host in zip([s for s, _ in pending], self.backend.get([m for _, m in pending])):
      self.history.append(host)
      self.last_step = step
      self.nonfinite_run = self.nonfinite_run + [step] if host["nonfinite"] else []
      if len(self.nonfinite_run) >= MAX_CONSECUTIVE_NONFINITE:
        raise NonFiniteError(f"loss or gradients were NaN/Inf for {len(self.nonfinite_run)} consecutive steps "
                             f"({self.nonfinite_run[0]}..{step}); those updates were skipped and training "
                             "stopped; the last checkpoint is intact")


def steps_in_flight(backend: parallel.Backend) -> int:
  """The bound on unfinished steps: MAX_STEPS_IN_FLIGHT on CPU; none (0) on GPU and TPU, whose runtimes bound
  their own queue of executions."""
  return MAX_STEPS_IN_FLIGHT if backend.platform == "cpu" else 0
