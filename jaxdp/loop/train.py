"""The trainer: `train_and_evaluate(config, workdir)`, one loop on `jaxdp.DataParallel` (CLI: `jaxdp.tools.train`)."""

import collections
import contextlib
import dataclasses
import functools
import gc
import logging
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections

from jaxdp import build
from jaxdp import config as config_lib
from jaxdp.library import DataParallel
from jaxdp.loop import audit, collector, goodput, hooks as hooks_lib, periodic, preemption, profiling, replicas
from jaxdp.loop import workdir_lock
from jaxdp.loop.step_metrics import NonFiniteError, StepMetrics  # noqa: F401  (jaxdp.train's name)
from jaxdp.report import flops as flops_lib
from jaxdp.report import metrics, progress, summary
from jaxdp.runtime import cpu_devices, exits, process

log = logging.getLogger("jaxdp")
PyTree = Any


@dataclasses.dataclass
class Result:
  """What a run leaves: the final (device) state, its backend and model, the last eval metrics; `params` and
  `model_state` one host copy."""
  state: Any  # step.TrainState
  backend: Any  # parallel.Backend
  eval_metrics: dict[str, float]
  preempted: bool = False  # Stopped by SIGTERM/SIGINT after checkpointing; rerun to resume.
  model: Any = None  # The model as the run built it (models.Model).
  resumed_from: int | None = None  # The checkpoint step this call resumed from (== num_train_steps: nothing to train).
  preempted_at: int | None = None  # The step checkpointed when a stop was requested.
  stopped_at: int | None = None  # The step checkpointed when a hook asked to stop (early stopping).

  @functools.cached_property
  def params(self) -> PyTree:
    """The trained parameters on the host, one copy."""
    return self.backend.get(self.state.params)

  @functools.cached_property
  def model_state(self) -> PyTree:
    """The model's non-parameter state (e.g. BatchNorm statistics) on the host, one copy."""
    return self.backend.get(self.state.model_state)


@dataclasses.dataclass
class _Run:
  """Everything a run is built from, before the loop starts."""
  run: build.Resolved  # The config's objects: dataset, model, task, optimizer, layout.
  dp: DataParallel
  workdir: str
  state: Any
  start: int                # The restored state's step (0: a fresh state).
  recorder: audit.Recorder  # Each step's example ids (config.audit_data) and the logged data/digest.
  clock: goodput.Clock      # Wall time per category (steps, compilation, input, ...), summed over restarts.
  batches: Any = None       # feed.Feeder: the train batches on the devices, from the restored step on.
  hooks: list[hooks_lib.Hook] = dataclasses.field(default_factory=list)  # The user's; the default trackers first.

  @property
  def config(self) -> ml_collections.ConfigDict:
    return self.run.config

  def evaluate(self, state: Any) -> dict[str, float]:
    """`eval/*` of the run's task over every example of the eval split."""
    return self.dp.evaluate(state, self.run.task, self.run.ds, batch_size=self.run.layout.eval_global_batch,
                            split=self.config.dataset.eval_split)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *, model: Any = None, task: Any = None,
                       train_data: Any = None, eval_data: Any = None, optimizer: Any = None,
                       hooks: Sequence[hooks_lib.Hook] = ()) -> Result:
  """Trains `config` to `num_train_steps`, resuming from WORKDIR/checkpoints/ when it has one.

  Objects replace the config's names (recorded as "<object ...>"): `model` an NNX module class or instance or a linen
  module, `task` a function or task object, `train_data`/`eval_data` arrays or a random-access source, `optimizer`
  any optax GradientTransformation; `hooks`: `jaxdp.Hook`s (docs/hooks.md). Under `jaxdp.launch` it joins the run.
  """
  config = config_lib.with_defaults(config)
  given = dict(model=model, task=task, train_data=train_data, eval_data=eval_data, optimizer=optimizer)
  try:
    hooks = hooks_lib.check(hooks)  # A wrong object fails before anything is built.
    process.join(config)  # As the CLI does before its command (a no-op after it); sets the compilation cache.
    # Whatever is opened is closed in reverse order, also on an exception or a preemption: the checkpoint
    # managers (after their pending saves), the metrics writers (TensorBoard events flushed), the progress display.
    with contextlib.ExitStack() as stack:
      compiles = stack.enter_context(goodput.CompileWatch())
      clock = goodput.Clock(workdir, compiles)
      run = _setup(config, workdir, stack, clock, given)
      run.hooks = hooks
      watcher = stack.enter_context(preemption.Watcher())
      return _train(run, watcher, stack)
  except BaseException as e:
    # An exception leaves with its frames released (`exits.release`), after the stack closed: a caller that keeps
    # it (a notebook's last error) no longer holds the input stream, which would hang interpreter exit.
    exits.release(e)
    gc.collect()  # Reference cycles through the released frames: collected now, not at interpreter exit.
    raise


def _setup(config: ml_collections.ConfigDict, workdir: str, stack: contextlib.ExitStack, clock: goodput.Clock,
           given: dict[str, Any]) -> _Run:
  """The config's objects on its `DataParallel`, reported; the newest checkpoint (or a fresh state); the batches."""
  with clock.span("setup"):
    run = build.resolve(config, **given)
    dp = stack.enter_context(DataParallel.from_config(run.named))
    _check_workdir(workdir)
    stack.enter_context(workdir_lock.hold(workdir))  # Before anything is written there: one run per workdir.
    profiling.parse_steps(config.profile_steps)  # A bad value fails before anything is restored.
    summary.report(summary.describe(run.named, dp.backend, run.layout, run.ds, run.model,
                                    run.task_info.describe() if run.task_info else ""))
    if dp.backend.devices[0].platform == "cpu" and jax.process_count() == 1:
      summary.report({"cpu_devs": cpu_devices.describe()}, title=None)
  with clock.span("restore"):
    state = dp.init(run.model, run.tx, seed=config.seed, restore=workdir)
  with clock.span("setup"):
    summary.report({"state": summary.state_size(state, dp.backend)}, title=None)  # As the strategy laid it out.
    start = int(dp.backend.get(state.step))
    read: collections.deque = collections.deque()  # The ids the reader read, for the audit's recorder.
    # The stream of the checkpoint is checked here, before anything is written.
    batches = dp.batches(run.ds, batch_size=run.layout.global_batch, seed=config.seed, start_step=start,
                         stop_step=config.num_train_steps, split=config.dataset.train_split,
                         on_ids=read.append if config.audit_data else None)
    stack.callback(batches.close)  # The prefetch thread stops however the loop ends.
    summary.report({"input": batches.about}, title=None)
    recorder = stack.enter_context(contextlib.closing(audit.start(
        workdir, config, run.ds, run.layout.global_batch, start, dp.restored_from, jax.process_index(),
        jax.process_count(), dp.num_devices, read)))
  return _Run(run, dp, workdir, state, start, recorder, clock, batches)


def _train(run: _Run, watcher: preemption.Watcher, stack: contextlib.ExitStack) -> Result:
  """The loop: step, log, check replicas, evaluate, checkpoint; stop cleanly when preempted."""
  config, state, clock, dp, batches = run.config, run.state, run.clock, run.dp, run.batches
  backend, total, start = dp.backend, config.num_train_steps, run.start
  train_step = dp.train_step(run.run.task, cast_inputs=run.run.cast_inputs)
  with clock.span("compile"):  # XLA's compile of the step, and the tracing and lowering before it.
    step_flops = dp.flops(state, batches) if start < total else None
  device = backend.devices[0]
  peak = flops_lib.peak_flops(device)
  summary.report({"compute": summary.compute(step_flops, peak, device)}, title=None)
  summary.report({"compile": run.clock.compiles.describe()}, title=None)
  with clock.span("setup"):
    hooks = stack.enter_context(contextlib.closing(hooks_lib.Hooks(  # The trackers write on process 0 only.
        metrics.trackers(run.workdir) + run.hooks, run.workdir, backend.get)))
    # The step time leaves out eval and checkpoint saves, as the clock times them (one timer for both).
    reporter = stack.enter_context(contextlib.closing(progress.Reporter(
        total, start, run.run.layout.global_batch, backend.num_devices, flops_per_step=step_flops,
        peak_flops=peak, untimed_seconds=clock.between_steps, headline=run.run.headline)))
  profiler = profiling.Profiler(run.workdir, config.profile_steps)
  stack.callback(profiler.stop)  # A run stopped inside the profiled steps still leaves its trace.
  garbage = stack.enter_context(collector.Collector(collector.EVERY_STEPS))
  loop = periodic.Periodic(run, hooks, reporter, StepMetrics(backend, run.recorder.ids), replicas.Sentinel(backend),
                           skipped_before=periodic.skipped_at(run.workdir, start))
  if start:  # The status lines are printed (not logged): a script or notebook sees them as the command line does.
    reporter.note(f"resumed from step {start} ({dp.checkpoints(run.workdir)}/{start})"
                  + (f"; nothing to train: step {start} of {total}" if start >= total else ""))
    loop.eval_metrics = _last_eval(run.workdir, start) if start >= total else {}
  with clock.span("setup"):
    hooks.call("on_start", start, state)
  with loop.saving_on_error():
    for step in range(start + 1, total + 1):
      # Input is only what the feed waited for, a batch not placed yet: on busy cores the loop's thread can wait
      # to run again after taking a ready batch, which is host time (docs/design-notes.md#loop-host-costs).
      waited = batches.waited
      batch = next(batches)
      clock.add("input", batches.waited - waited)
      profiler.before(step)
      with clock.span("train"):  # Dispatch, and waiting for an older step when too many are in flight.
        # The step donates `state`: the last completed one can no longer be saved, and dropping it here releases
        # the previous step's arrays in the step's time, as any loop pays it (not as host work between steps).
        loop.completed = None
        state, step_metrics = train_step(state, batch)
        loop.tracker.push(step, step_metrics)
      garbage.after(step)  # While the devices run the step just dispatched.
      loop.completed = (step, state)
      run.recorder.record(step)
      reporter.on_step(step)
      loop.periodic(step, state)
      profiler.after(step, state)
      # A preemption signal, or a hook's request, on any process: every process stops here, checkpointed.
      preempted = watcher.should_stop(step)
      if preempted or (hooks.should_stop(step, state) and step < total):
        if loop.saved != step:
          loop.save(step, state)
        reporter.note(f"step {step}: stop requested; checkpoint saved, exiting (preempted at step {step})" if preempted
                      else f"step {step}: {hooks.stopped_by or 'a hook'} asked to stop; checkpoint saved (stopped at "
                           f"step {step})")
        loop.finish(step)
        return Result(state, backend, loop.eval_metrics, preempted=preempted, model=run.run.model,
                      resumed_from=start or None, preempted_at=step if preempted else None,
                      stopped_at=None if preempted else step)
  reporter.done()
  loop.finish(total)
  return Result(state, backend, loop.eval_metrics, model=run.run.model, resumed_from=start or None)


def _last_eval(workdir: str, step: int) -> dict[str, float]:
  """The eval metrics metrics.jsonl holds for `step` (a finished run's last), or {} where it holds none."""
  try:
    records = [r for r in metrics.read(workdir) if r.get("step") == step]
  except (OSError, ValueError):
    return {}
  return {k: v for r in records for k, v in r.items() if k.startswith("eval/")}


def _check_workdir(workdir: str) -> None:
  """Fails early, with the path, when the workdir cannot be written."""
  try:
    os.makedirs(workdir, exist_ok=True)
    with tempfile.TemporaryFile(dir=workdir):
      pass
  except OSError as e:
    raise config_lib.ConfigError(f"workdir {workdir!r} is not writable: {e.strerror or e}") from None
