"""`python -m jaxdp.train --config CONFIG.py --workdir DIR [--config.key=value ...] [--cpu_devices N]`.

`train_and_evaluate(config, workdir)`: the training loop, also called by tests and notebooks; the
command line itself (flags, process setup, exit statuses) is `jaxdp.cli`.
"""

import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections

from jaxdp import audit, build, checkpoint, cli, data, evaluate, metrics, models, parallel, preemption, progress
from jaxdp import replicas, summary
from jaxdp import config as config_lib
from jaxdp import flops as flops_lib
from jaxdp import step as step_lib

log = logging.getLogger("jaxdp")
PyTree = Any


@dataclasses.dataclass
class Result:
  """What a run leaves: the final (device) state, its backend and model, the last eval metrics.

  `params` and `model_state` are one host copy (no device axis, for either backend), so that
  `sample.sample_text(result.model, result.params, result.model_state, ...)` works on any run.
  """
  state: step_lib.TrainState
  backend: parallel.Backend
  eval_metrics: dict[str, float]
  preempted: bool = False  # Stopped by SIGTERM/SIGINT after checkpointing; rerun to resume.
  model: models.Model | None = None  # The model as the run built it.

  @functools.cached_property
  def params(self) -> PyTree:
    """The trained parameters on the host, one copy."""
    return self.backend.get(self.state.params)

  @functools.cached_property
  def model_state(self) -> PyTree:
    """The model's non-parameter state (e.g. BatchNorm statistics) on the host, one copy."""
    return self.backend.get(self.state.model_state)


class NonFiniteError(RuntimeError):
  """The loss or gradients stayed NaN/Inf for too many consecutive steps."""


@dataclasses.dataclass
class _Run:
  """Everything a run is built from, before the loop starts."""
  parts: build.Parts
  workdir: str
  checkpointer: checkpoint.Checkpointer
  state: step_lib.TrainState
  recorder: audit.Recorder  # Each step's example ids (config.audit_data) and the logged data/digest.


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Result:
  """Trains `config` to `num_train_steps`, resuming from WORKDIR/checkpoints/ when it has one."""
  # Whatever is opened is closed in reverse order, also on an exception or a preemption: the checkpoint
  # manager (after its pending saves), the metrics writers (TensorBoard events flushed), the progress display.
  with contextlib.ExitStack() as stack:
    run = _setup(config, workdir, stack)
    watcher = stack.enter_context(preemption.Watcher(config.get("preemption_sync_every_steps", 1)))
    return _train(run, watcher, stack)


def _setup(config: ml_collections.ConfigDict, workdir: str, stack: contextlib.ExitStack) -> _Run:
  """Builds the run's parts, reports them, and restores the newest checkpoint (or initializes)."""
  parts = build.build(config)
  _check_workdir(workdir)
  summary.report(summary.describe(config, parts.backend, parts.layout, parts.ds, parts.model))
  stream = data.stream_spec(parts.ds, config.dataset.train_split, seed=config.seed,
                            global_batch=parts.layout.global_batch, process_count=jax.process_count())
  # Restore checks the stream (resume guard); the checkpointer closes itself if restore raises.
  checkpointer = stack.enter_context(checkpoint.Checkpointer(workdir, config, stream=stream))
  state = checkpointer.restore_or_init(parts.backend, parts.init)
  recorder = stack.enter_context(contextlib.closing(audit.start(
      workdir, config, parts.ds, parts.layout.global_batch, int(parts.backend.get(state.step)),
      checkpointer.latest_step(), jax.process_index(), jax.process_count(), parts.backend.num_devices)))
  return _Run(parts, workdir, checkpointer, state, recorder)


def _train(run: _Run, watcher: preemption.Watcher, stack: contextlib.ExitStack) -> Result:
  """The loop: step, log, check replicas, evaluate, checkpoint; stop cleanly when preempted."""
  parts, config, state = run.parts, run.parts.config, run.state
  backend, total = parts.backend, config.num_train_steps
  start = int(backend.get(state.step))
  if start:
    log.info("resumed from %s/%d%s", run.checkpointer.directory, start,
             "; already at num_train_steps, nothing to train" if start >= total else "")
  batches = parallel.prefetch(backend, data.train_batches(
      parts.ds, config.dataset.train_split, seed=config.seed, global_batch=parts.layout.global_batch,
      start_step=start, process_index=jax.process_index(), process_count=jax.process_count()),
      config.parallel.prefetch)
  step_flops, batches = _count_flops(parts, state, batches, start < total)
  writer = stack.enter_context(contextlib.closing(metrics.create_writer(run.workdir)))  # Process 0 only.
  reporter = stack.enter_context(contextlib.closing(progress.Reporter(
      total, start, parts.layout.global_batch, backend.num_devices, flops_per_step=step_flops,
      peak_flops=flops_lib.peak_flops(backend.devices[0]))))
  tracker = _StepMetrics(backend, config.parallel.max_steps_in_flight, config.get("max_consecutive_nonfinite", 5))
  sentinel = replicas.Sentinel(backend)
  eval_metrics: dict[str, float] = {}
  saved = start
  for step in range(start + 1, total + 1):
    state, step_metrics = parts.train_step(state, next(batches))
    run.recorder.record(step)
    tracker.push(step, step_metrics)
    reporter.on_step(step)
    if _itstime(step, config.log_every_steps, total):
      train_metrics = tracker.flush()
      writer.write(step, {**train_metrics, **reporter.on_log(step, train_metrics), **run.recorder.metrics(step)})
    if _itstime(step, config.get("check_replicas_every_steps", 0), total):
      sentinel.check(state.params)
    evaluated = _itstime(step, config.eval_every_steps, total)
    if evaluated:
      with reporter.untimed() as span:
        eval_metrics = evaluate.run(parts, state)
      writer.write(step, {**eval_metrics, "time/eval": span.seconds})
      reporter.on_eval(step, eval_metrics)
    if _itstime(step, config.get("checkpoint_every_steps", 0), total):
      saved = _save(run, step, state, writer, reporter, eval_metrics if evaluated else None)
    if watcher.should_stop(step):
      if saved != step:
        _save(run, step, state, writer, reporter, force=True)
      log.info("step %d: stop requested; checkpoint saved, exiting", step)
      return Result(state, backend, eval_metrics, preempted=True, model=parts.model)
  reporter.done()
  return Result(state, backend, eval_metrics, model=parts.model)


def _count_flops(parts: build.Parts, state: step_lib.TrainState, batches: Iterator,
                 will_train: bool) -> tuple[float | None, Iterator]:
  """The step's FLOPs per device (XLA cost analysis of the compiled step on the first batch), printed.

  Returns the FLOPs and `batches` with the first batch put back. With no accumulation loop the compile
  done here is the one the first real step reuses (JAX caches the executable).
  """
  step_flops = None
  if will_train:
    first = next(batches)
    batches = itertools.chain([first], batches)
    step_flops = flops_lib.step_flops(parts.flops_step or parts.train_step, state, first)
  device = parts.backend.devices[0]
  summary.report({"compute": summary.compute(step_flops, flops_lib.peak_flops(device), device)}, title=None)
  return step_flops, batches


def _save(run: _Run, step: int, state: step_lib.TrainState, writer: metrics.MultiWriter,
          reporter: progress.Reporter, eval_metrics: dict[str, float] | None = None, force: bool = False) -> int:
  """Checkpoints `state`; its time is written as `time/checkpoint`, outside the step timing. Returns `step`."""
  jax.block_until_ready(state)  # The steps in flight are training time: let them finish on the clock.
  with reporter.untimed() as span:
    run.checkpointer.save(step, state, run.parts.backend, eval_metrics, force=force)
  run.recorder.saved(step)
  writer.write(step, {"time/checkpoint": span.seconds})
  return step


class _StepMetrics:
  """Reads each step's metrics one step late, which bounds the steps in flight, and guards NaNs."""

  def __init__(self, backend: parallel.Backend, max_in_flight: int, max_nonfinite: int):
    self.backend, self.max_in_flight, self.max_nonfinite = backend, max_in_flight, max_nonfinite
    self.in_flight: collections.deque = collections.deque()
    self.history: list[dict] = []
    self.nonfinite_run: list[int] = []
    self.last_step = 0

  def push(self, step: int, step_metrics: dict) -> None:
    self.in_flight.append((step, step_metrics))
    # Many steps in flight deadlock fake CPU devices; reading an older step's metrics waits for it.
    while len(self.in_flight) >= self.max_in_flight:
      self._read()

  def flush(self) -> dict[str, float]:
    """Mean train metrics since the last flush (`train/loss`, ...), with the skipped steps counted."""
    while self.in_flight:
      self._read()
    history, self.history = self.history, []
    out = metrics.mean(history, "train")
    out["train/nonfinite"] = float(sum(h["nonfinite"] for h in history))  # Skipped updates, not a mean.
    log.debug("step %d: %s", self.last_step, out)  # The progress reporter prints the readable line.
    return out

  def _read(self) -> None:
    step, device_metrics = self.in_flight.popleft()
    host = self.backend.get(device_metrics)
    self.history.append(host)
    self.last_step = step
    self.nonfinite_run = self.nonfinite_run + [step] if host["nonfinite"] else []
    if self.max_nonfinite and len(self.nonfinite_run) >= self.max_nonfinite:
      raise NonFiniteError(f"loss or gradients were NaN/Inf for {len(self.nonfinite_run)} consecutive steps "
                           f"({self.nonfinite_run[0]}..{step}); those updates were skipped and training stopped; "
                           "the last checkpoint is intact")


def _itstime(step: int, every: int, total: int) -> bool:
  """Periodic work runs every `every` steps and at the last step; never when `every` is 0."""
  return every > 0 and (step % every == 0 or step == total)


def _check_workdir(workdir: str) -> None:
  """Fails early, with the path, when the workdir cannot be written."""
  try:
    os.makedirs(workdir, exist_ok=True)
    with tempfile.TemporaryFile(dir=workdir):
      pass
  except OSError as e:
    raise config_lib.ConfigError(f"workdir {workdir!r} is not writable: {e.strerror or e}") from None


parse = cli.parse  # Kept importable for callers of `train.parse`; the parser lives in jaxdp.cli.


def main(argv: list[str]) -> int:
  """Runs the CLI; returns the exit status (2 for a config or command-line mistake)."""
  return cli.main(argv, train_and_evaluate, failures=(NonFiniteError, replicas.ReplicaMismatchError),
                  usage="python -m jaxdp.train --config CONFIG.py --workdir DIR [--config.key=value ...]")


if __name__ == "__main__":
  sys.exit(main(sys.argv))
