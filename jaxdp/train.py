"""`python -m jaxdp.train --config CONFIG.py --workdir DIR [--config.key=value ...] [--cpu_devices N]`.

Flags -> config -> `train_and_evaluate(config, workdir)`: the training loop, also called by tests and
notebooks.
"""

import sys

from jaxdp import cpu_devices

if __name__ == "__main__":  # Before JAX is imported: XLA reads XLA_FLAGS only once.
  if (_count := cpu_devices.requested(sys.argv)) is not None:
    cpu_devices.simulate(_count)

import collections  # noqa: E402
import dataclasses  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxdp import config as config_lib  # noqa: E402
from jaxdp import build, checkpoint, data, metrics, parallel, preemption, progress, replicas  # noqa: E402
from jaxdp import distributed, summary  # noqa: E402
from jaxdp import step as step_lib  # noqa: E402

log = logging.getLogger("jaxdp")


@dataclasses.dataclass
class Result:
  """What a run leaves: the final (device) state, its backend, the last eval metrics."""
  state: step_lib.TrainState
  backend: parallel.Backend
  eval_metrics: dict[str, float]
  preempted: bool = False  # Stopped by SIGTERM/SIGINT after checkpointing; rerun to resume.


class NonFiniteError(RuntimeError):
  """The loss or gradients stayed NaN/Inf for too many consecutive steps."""


@dataclasses.dataclass
class _Run:
  """Everything a run is built from, before the loop starts."""
  config: ml_collections.ConfigDict
  workdir: str
  layout: config_lib.Layout
  backend: parallel.Backend
  ds: data.Dataset
  checkpointer: checkpoint.Checkpointer
  state: step_lib.TrainState
  train_step: Callable
  eval_step: Callable


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Result:
  """Trains `config` to `num_train_steps`, resuming from WORKDIR/checkpoints/ when it has one."""
  run = _setup(config, workdir)
  try:
    with preemption.Watcher(config.get("preemption_sync_every_steps", 1)) as watcher:
      return _train(run, watcher)
  finally:
    run.checkpointer.wait()  # Never exit with a save half-written.
    run.checkpointer.close()


def _setup(config: ml_collections.ConfigDict, workdir: str) -> _Run:
  """Builds the run's parts, reports them, and restores the newest checkpoint (or initializes)."""
  parts = build.build(config)
  _check_workdir(workdir)
  summary.report(summary.describe(config, parts.backend, parts.layout, parts.ds, parts.model))
  stream = data.stream_spec(parts.ds, config.dataset.train_split, seed=config.seed,
                            global_batch=parts.layout.global_batch, process_count=jax.process_count())
  checkpointer = checkpoint.Checkpointer(workdir, config, stream=stream)  # Restore checks the stream (resume guard).
  state = checkpointer.restore_or_init(parts.backend, parts.init)
  return _Run(config, workdir, parts.layout, parts.backend, parts.ds, checkpointer, state, parts.train_step,
              parts.eval_step)


def _train(run: _Run, watcher: preemption.Watcher) -> Result:
  """The loop: step, log, check replicas, evaluate, checkpoint; stop cleanly when preempted."""
  config, backend, state = run.config, run.backend, run.state
  start, total = int(backend.get(state.step)), config.num_train_steps
  if start:
    log.info("resumed from %s/%d%s", run.checkpointer.directory, start,
             "; already at num_train_steps, nothing to train" if start >= total else "")
  batches = parallel.prefetch(backend, data.train_batches(
      run.ds, config.dataset.train_split, seed=config.seed, global_batch=run.layout.global_batch,
      start_step=start, process_index=jax.process_index(), process_count=jax.process_count()),
      config.parallel.prefetch)
  writer = metrics.create_writer(run.workdir)  # metrics.jsonl + TensorBoard, process 0 only.
  reporter, batches = progress.start(run.train_step, state, batches, start_step=start, total_steps=total,
                                     global_batch=run.layout.global_batch, devices=backend.devices)
  tracker = _StepMetrics(backend, config.parallel.max_steps_in_flight, config.get("max_consecutive_nonfinite", 5))
  sentinel = replicas.Sentinel(backend)
  eval_metrics: dict[str, float] = {}
  for step in range(start + 1, total + 1):
    state, step_metrics = run.train_step(state, next(batches))
    tracker.push(step, step_metrics)
    reporter.on_step(step)
    if _itstime(step, config.log_every_steps, total):
      train_metrics = tracker.flush()
      writer.write(step, {**train_metrics, **reporter.on_log(step, train_metrics)})
    if _itstime(step, config.get("check_replicas_every_steps", 0), total):
      sentinel.check(state.params)
    evaluated = _itstime(step, config.eval_every_steps, total)
    if evaluated:
      eval_metrics = _evaluate(run, state)
      writer.write(step, eval_metrics)
      reporter.on_eval(step, eval_metrics)
    if _itstime(step, config.get("checkpoint_every_steps", 0), total):
      run.checkpointer.save(step, state, backend, eval_metrics if evaluated else None)
    if watcher.should_stop(step):
      run.checkpointer.save(step, state, backend, force=True)
      log.info("step %d: stop requested; checkpoint saved, exiting", step)
      return Result(state, backend, eval_metrics, preempted=True)
  reporter.close()
  writer.close()
  return Result(state, backend, eval_metrics)


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


def _evaluate(run: _Run, state: step_lib.TrainState) -> dict[str, float]:
  """Loss and accuracy over every example of the eval split, each counted once."""
  batches = data.eval_batches(run.ds, run.config.dataset.eval_split, global_batch=run.layout.eval_global_batch,
                              process_index=jax.process_index(), process_count=jax.process_count())
  totals = None
  for batch in batches:
    sums = run.backend.get(run.eval_step(state, run.backend.put_batch(batch)))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  return metrics.summarize_eval(totals)


def _check_workdir(workdir: str) -> None:
  """Fails early, with the path, when the workdir cannot be written."""
  try:
    os.makedirs(workdir, exist_ok=True)
    with tempfile.TemporaryFile(dir=workdir):
      pass
  except OSError as e:
    raise config_lib.ConfigError(f"workdir {workdir!r} is not writable: {e.strerror or e}") from None


def parse(argv: list[str], require_workdir: bool = True) -> tuple[ml_collections.ConfigDict, str | None]:
  """Command line -> (config, workdir); every mistake is a ConfigError naming the bad value."""
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "Path to a config .py file with get_config().",
                                  flag_values=fv, sys_argv=argv)
  flags.DEFINE_string("workdir", None, "Directory for metrics.jsonl and checkpoints.", flag_values=fv)
  flags.DEFINE_integer("cpu_devices", None, "Simulate this many CPU devices (or JAXDP_CPU_DEVICES).",
                       flag_values=fv)
  try:
    fv(argv)
  except flags.Error as e:
    raise config_lib.ConfigError(str(e)) from None
  except (AttributeError, KeyError) as e:  # An override names a key the config does not have.
    raise config_lib.ConfigError(f"unknown config key '{_bad_override(argv, e)}") from None
  if not fv["config"].present:
    raise config_lib.ConfigError("--config is required (e.g. --config jaxdp/configs/default.py)")
  if require_workdir and not fv.workdir:
    raise config_lib.ConfigError("--workdir is required")
  path = fv["config"].config_filename
  if not os.path.isfile(path):
    raise config_lib.ConfigError(f"config file {path!r} not found")
  try:
    return fv.config, fv.workdir
  except Exception as e:  # The config file itself failed to load (syntax error, bad import, ...).
    raise config_lib.ConfigError(f"could not load config file {path!r}: {e.__cause__ or e}") from None


def _bad_override(argv: list[str], error: Exception) -> str:
  """The `--config.x.y` flag that failed with KeyError/AttributeError 'y', with ml_collections' hint."""
  key = re.search(r"\w+", str(error)).group()
  hint = re.search(r'Did you mean "(\w+)"', str(error))
  flag = next((a.split("=")[0].lstrip("-") for a in argv if re.match(rf"--config\.([\w.]+\.)?{key}\b", a)), key)
  return f"{flag}'" + (f" (did you mean {hint.group(1)!r}?)" if hint else "")


def main(argv: list[str]) -> int:
  """Runs the CLI; returns the exit status (2 for a config or command-line mistake)."""
  logging.basicConfig(format="%(message)s", stream=sys.stdout, force=True)
  log.setLevel(logging.INFO)  # jaxdp's own lines; libraries stay at WARNING.
  try:
    config, workdir = parse(argv)
    if distributed.initialize(config) and jax.process_index() != 0:
      log.setLevel(logging.WARNING)  # Only process 0 logs progress.
    train_and_evaluate(config, workdir)
  except config_lib.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except (NonFiniteError, replicas.ReplicaMismatchError, distributed.DistributedInitError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0  # Also after a preemption: the checkpoint is written and a rerun resumes.


if __name__ == "__main__":
  sys.exit(main(sys.argv))
