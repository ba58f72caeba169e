"""The loop's periodic work after a step (log, replica check, eval, checkpoint) and what it keeps between steps."""

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxdp.loop import hooks as hooks_lib, replicas
from jaxdp.loop.step_metrics import NonFiniteError, StepMetrics
from jaxdp.report import progress
from jaxdp.report.learning_rate import LearningRate

log = logging.getLogger("jaxdp")
# `train/skipped_examples` through each checkpointed step (process 0 writes it): a resumed run counts on.
SKIPPED_FILE = "skipped_examples.json"


@dataclasses.dataclass
class Periodic:
  """The loop's periodic work (log, replica check, eval, checkpoint) and what it remembers between steps."""
  run: Any  # loop.train._Run: the resolved config, its DataParallel, workdir, batches, recorder and clock.
  writer: hooks_lib.Hooks  # The trackers (metrics.jsonl, TensorBoard, ...) and the user's hooks.
  reporter: progress.Reporter
  tracker: StepMetrics
  sentinel: replicas.Sentinel
  eval_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  saved: int = -1  # The last step checkpointed by this run.
  completed: tuple[int, Any] | None = None  # The last step dispatched whose metrics were taken (a TrainState).
  skipped_before: int = 0  # Bad examples replaced in the steps before this run's first (earlier runs').

  def __post_init__(self) -> None:
    self.learning_rate = LearningRate(self.run.run.named, self.run.dp.backend.get)

  def periodic(self, step: int, state: Any) -> None:
    """Whatever is due after `step`: train metrics, replica check, eval, checkpoint."""
    config, total, clock = self.run.config, self.run.config.num_train_steps, self.run.clock
    if itstime(step, config.log_every_steps, total):
      with clock.span("train"):  # Fetching the metrics waits for the steps in flight.
        train_metrics = {**self.tracker.flush(), **self.learning_rate(step, state)}
      skipped = self._skipped(step)
      self.writer.write(step, {**train_metrics, **self.reporter.on_log(step, train_metrics),
                               **self.run.recorder.metrics(step), **skipped, **clock.scalars(),
                               "perf/input_wait": clock.input_wait()})
      clock.save()
      self.writer.call("on_log", step, state, {**train_metrics, **skipped})
    if itstime(step, config.checkpoint_every_steps, total) or step == total:  # Before a diverged copy is saved.
      with clock.span("train"):
        self.sentinel.check(state.params)
    evaluated = itstime(step, config.eval_every_steps, total)
    if evaluated:
      with clock.span("eval") as span:  # Also left out of the progress line's step time (between_steps).
        self.eval_metrics = self.run.evaluate(state)
      self.writer.write(step, {**self.eval_metrics, "time/eval": span.seconds})
      self.reporter.on_eval(step, self.eval_metrics)
      self.writer.call("on_eval", step, state, self.eval_metrics)
    if itstime(step, config.checkpoint_every_steps, total):
      self.save(step, state, self.eval_metrics if evaluated else None)

  def save(self, step: int, state: Any, eval_metrics: dict[str, float] | None = None) -> None:
    """Checkpoints `state`; its time is written as `time/checkpoint`, outside the step timing."""
    with self.run.clock.span("train"):
      jax.block_until_ready(state)  # The steps in flight are training time: let them finish on the clock.
    if self.run.config.dataset.skip_bad_examples:  # Before the save: a checkpoint always has its count.
      record_skipped(self.run.workdir, step, self._skipped_through(step))
    with self.run.clock.span("checkpoint") as span:  # Left out of the step time, as eval is.
      self.run.dp.save(self.run.workdir, state, metrics=eval_metrics, wait=False)
    self.saved = step  # Before the hooks: one that raises must not make the error path save this step again.
    self.run.recorder.saved(step)
    self.writer.write(step, {"time/checkpoint": span.seconds})
    self.run.clock.save()
    self.writer.call("on_checkpoint", step, state, eval_metrics)

  def _skipped(self, step: int) -> dict[str, float]:
    """`train/skipped_examples`: bad examples replaced so far (with skip_bad_examples), as `_skipped_through`."""
    if not self.run.config.dataset.skip_bad_examples:
      return {}
    return {"train/skipped_examples": float(self._skipped_through(step))}

  def _skipped_through(self, step: int) -> int:
    """Bad examples replaced in every process's rows of steps 1..`step`, over this workdir's runs (collective)."""
    here = self.run.batches.skipped_through(step)
    if jax.process_count() > 1:
      here = int(np.sum(multihost_utils.process_allgather(np.array([here], np.int32))))
    return self.skipped_before + here

  @contextlib.contextmanager
  def saving_on_error(self) -> Iterator[None]:
    """On an error (not NaN/Inf or a replica mismatch: that state is not good), checkpoints the last completed step
    first; one process only (docs/design-notes.md#saving-on-error)."""
    try:
      yield
    except (NonFiniteError, replicas.ReplicaMismatchError):
      raise
    except Exception:
      if self._unsaved_step():
        self._save_on_the_way_out(*self.completed)
      raise

  def _unsaved_step(self) -> bool:
    """Whether a completed step is not checkpointed yet and may be (checkpointing on, one process)."""
    every = self.run.config.checkpoint_every_steps
    return self.completed is not None and self.completed[0] != self.saved and every > 0 and jax.process_count() == 1

  def _save_on_the_way_out(self, step: int, state: Any) -> None:
    """Saves `state` as step `step` and waits for it; a failing save is logged, never raised over the error."""
    try:
      self.save(step, state)
      self.run.dp.wait()
      log.warning("step %d: checkpoint saved before stopping on the error below", step)
    except Exception as e:  # The original error is the one to report; this one only explains a missing save.
      log.warning("step %d: could not checkpoint before stopping: %s", step, e)

  def finish(self, step: int) -> None:
    """The run's time per category (summed over this workdir's runs): the last record and line."""
    with self.run.clock.span("checkpoint"):
      self.run.dp.wait()  # Pending asynchronous saves are part of the run.
    self.writer.write(step, self.run.clock.scalars())
    self.run.clock.save()
    self.reporter.note(self.run.clock.line())


def skipped_at(workdir: str, step: int) -> int:
  """`train/skipped_examples` through checkpointed step `step` (0 at step 0, or when none was recorded)."""
  try:
    with open(os.path.join(workdir, SKIPPED_FILE)) as f:
      return int(json.load(f).get(str(step), 0)) if step else 0
  except (OSError, ValueError, TypeError, AttributeError):
    return 0


def record_skipped(workdir: str, step: int, count: int) -> None:
  """Adds `count` as the bad examples through step `step` (process 0; replaced atomically, as goodput's file)."""
  if jax.process_index() != 0:
    return
  path = os.path.join(workdir, SKIPPED_FILE)
  try:
    with open(path) as f:
      counts = json.load(f)
  except (OSError, ValueError):
    counts = {}
  counts[str(step)] = count  # A step trained again after a restart replaces the same bad rows: the same count.
  with open(path + ".tmp", "w") as f:
    json.dump(counts, f)
  os.replace(path + ".tmp", path)


def itstime(step: int, every: int, total: int) -> bool:
  """Periodic work runs every `every` steps and at the last step; never when `every` is 0."""
  return every > 0 and (step % every == 0 or step == total)
