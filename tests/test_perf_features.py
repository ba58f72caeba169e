"""Loop performance features: no host sync per step, goodput (time/*), profiling, the compilation cache."""

import contextlib
import glob
import json
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import monitoring

from jaxdp import config as config_lib, feed, library, train, wrap
from jaxdp.loop import goodput, preemption, replicas, step_metrics
from jaxdp.report import metrics
from jaxdp.runtime import process

CATEGORIES = ("train", "compile", "input", "eval", "checkpoint", "restore", "setup")


def test_metrics_stay_on_device_until_a_log_step(monkeypatch):
  fetched = []
  backend = types.SimpleNamespace(get=lambda tree: fetched.append(len(tree)) or jax.tree.map(np.asarray, tree))
  tracker = step_metrics.StepMetrics(backend)
  for step in range(1, 6):
    tracker.push(step, {"loss": jnp.float32(step), "accuracy": jnp.float32(0), "nonfinite": jnp.int32(0)})
  assert fetched == []  # Nothing copied to the host before the log step.
  out = tracker.flush()
  assert fetched == [5] and out["train/loss"] == 3.0  # One fetch of five steps, their mean.


def test_a_bounded_step_waits_only_for_the_steps_beyond_its_bound():
  waited = []

  class Metric:  # A step's output that says when the host waited for it.
    def __init__(self, step):
      self.step = step

    def block_until_ready(self):
      waited.append(self.step)
      return self

  def step(state, batch):
    return state, {"nonfinite": Metric(batch)}

  step.lower = None  # What a jitted step has.
  bounded = wrap.bounded(step, types.SimpleNamespace(platform="cpu"))
  for i in range(1, 6):
    bounded(None, i)
  assert wrap.MAX_STEPS_IN_FLIGHT == 2 and waited == [1, 2, 3]  # Two steps left unfinished.
  assert wrap.bounded(step, types.SimpleNamespace(platform="gpu")) is step  # Unbounded where the runtime bounds.


class SpanWatch:
  """The loop clock's own readings: its spans, its runs, the seconds added from outside (input waits), and which of
  `DataParallel`'s timed calls ran outside every span."""

  TIMED = ("init", "flops", "evaluate", "save", "wait")  # Restore (or init), compile, eval, checkpoint saves.

  def __init__(self, monkeypatch: pytest.MonkeyPatch):
    self.open, self.reads, self.spans, self.runs, self.totals, self.added, self.calls = 0, [], [], [], [], [], []
    clock_type = goodput.Clock
    span, init, totals, add = clock_type.span, clock_type.__init__, clock_type.totals, clock_type.add

    @contextlib.contextmanager
    def watched(clock: goodput.Clock, category: str):
      self.open, began = self.open + 1, len(self.reads)  # The span's first reading is its start ...
      try:
        with span(clock, category) as s:
          yield s
          ended = len(self.reads)  # ... and its next one after the body, its end.
      finally:
        self.open -= 1
      if not self.open:  # Spans inside spans: their outermost.
        self.spans.append((self.reads[began], self.reads[ended]))

    def started(clock: goodput.Clock, *args, **kwargs) -> None:
      init(clock, *args, **kwargs)
      read, self.runs = clock._clock, self.runs + [clock.began]
      clock._clock = lambda: self.reads.append(read()) or self.reads[-1]

    def read(clock: goodput.Clock) -> dict[str, float]:
      n = len(self.reads)
      out = totals(clock)
      self.totals.append((self.caller, self.reads[n]))
      return out

    def reading_for(caller: str, method):
      def through(clock: goodput.Clock):
        self.caller = caller
        try:
          return method(clock)
        finally:
          self.caller = None
      return through

    self.caller = None  # Which of the clock's methods is reading its totals: `save` (on disk) or `scalars` (a record).
    monkeypatch.setattr(clock_type, "span", watched)
    monkeypatch.setattr(clock_type, "__init__", started)
    monkeypatch.setattr(clock_type, "totals", read)
    monkeypatch.setattr(clock_type, "save", reading_for("save", clock_type.save))
    monkeypatch.setattr(clock_type, "scalars", reading_for("scalars", clock_type.scalars))
    monkeypatch.setattr(clock_type, "add", lambda clock, category, seconds: self.added.append(
        (category, seconds, self.open > 0)) or add(clock, category, seconds))
    for name in self.TIMED:
      monkeypatch.setattr(library.DataParallel, name, self._noted(name, getattr(library.DataParallel, name)))

  def _noted(self, name: str, method):
    def noted(*args, **kwargs):
      self.calls.append((name, self.open > 0))
      return method(*args, **kwargs)
    return noted

  def outside(self, ends: list[float]) -> float:
    """Seconds of the runs' walls (each from its clock's start to its end in `ends`) in no span."""
    seconds = 0.0
    for began, ended in zip(self.runs, ends):
      seconds += ended - began - sum(min(e, ended) - max(b, began) for b, e in self.spans if b < ended and e > began)
    return seconds


def test_time_keys_add_up_to_the_wall_time_over_restarts(config, tmp_path, capsys, monkeypatch):
  """Every second of the wall is in one category, or in the loop's host work between the clock's spans; and what
  takes time (restore, compile, eval, saves) runs inside a span. Checked by the events, not against a share of the
  wall: on a loaded machine the host work between spans takes longer."""
  watch = SpanWatch(monkeypatch)
  config.num_train_steps, config.checkpoint_every_steps, config.eval_every_steps = 4, 4, 4
  train.train_and_evaluate(config, str(tmp_path))
  first = metrics.read(str(tmp_path))[-1]
  config.num_train_steps = 6  # A restart of the same workdir resumes at 4.
  train.train_and_evaluate(config, str(tmp_path))
  last = metrics.read(str(tmp_path))[-1]
  # Where each run's wall ends in `last`: the first run's at its last save (the restart loads it), the second at
  # the record.
  ends = [max(t for caller, t in watch.totals if caller == "save" and t < watch.runs[1]),
          max(t for caller, t in watch.totals if caller == "scalars")]
  parts = sum(last[f"time/total/{k}"] for k in CATEGORIES)
  assert len(watch.runs) == 2 and {name for name, _ in watch.calls} == set(SpanWatch.TIMED)
  assert [name for name, inside in watch.calls if not inside] == []
  assert watch.added and not any(inside for _, _, inside in watch.added)  # Input waits: timed by the feed, outside.
  waits = sum(seconds for _, seconds, _ in watch.added)
  assert last["time/total/wall"] - parts == pytest.approx(watch.outside(ends) - waits, abs=1e-6), last
  assert last["time/total/wall"] > first["time/total/wall"]  # Summed over both runs.
  assert all(last[f"time/total/{k}"] > 0 for k in ("train", "compile", "eval", "checkpoint", "restore"))
  assert last["time/goodput"] == pytest.approx(last["time/total/train"] / last["time/total/wall"])
  assert "wall over 2 runs" in capsys.readouterr().out


def test_the_runs_time_is_on_disk_from_its_first_log_step(config, tmp_path, monkeypatch):
  """A run killed between checkpoints still adds its time to the workdir's totals: the clock is saved at each log."""
  on_disk = []

  def peek(self, step: int) -> bool:
    if step == 3:  # After the log of step 2; nothing checkpointed, nothing finished.
      with open(tmp_path / goodput.FILE) as f:
        on_disk.append(json.load(f)["seconds"])
    return False

  monkeypatch.setattr(preemption.Watcher, "should_stop", peek)
  train.train_and_evaluate(config, str(tmp_path))  # Logs at steps 2 and 4; checkpoints off.
  assert len(on_disk) == 1 and on_disk[0]["train"] > 0 and on_disk[0]["compile"] > 0, on_disk


def test_the_time_line_names_the_shares_that_took_any_time_in_print_order(tmp_path):
  """20 s of wall: 18 s of steps (90%), 1.97 s of input (10%), 20 ms of checkpoints (0.1%, shown as 0%) and 9 ms of
  eval (under 0.05% of the wall: left out, as every category that took no time is)."""
  now = [0.0]
  clock = goodput.Clock(str(tmp_path), goodput.CompileWatch(), clock=lambda: now[0])
  for category, seconds in (("eval", 0.009), ("train", 18.0), ("checkpoint", 0.02)):
    with clock.span(category):
      now[0] += seconds
  clock.add("input", 1.97)
  now[0] = 20.0
  assert clock.line() == "time | 0:00:20 wall over 1 run: 90% training, 10% input, 0% checkpoint saves"


def _slow_stream(monkeypatch, delay_s: float) -> None:
  """Every train batch read `delay_s` late, each placed in a transfer of its own (each step waits for its own)."""
  from jaxdp import data
  read = data.train_batches

  def slow(*args, **kwargs):
    for batch in read(*args, **kwargs):
      time.sleep(delay_s)
      yield batch

  monkeypatch.setattr(data, "train_batches", slow)
  monkeypatch.setattr(feed, "BLOCK_MIB", 0)


def test_a_slow_stream_is_booked_as_input(config, tmp_path, monkeypatch):
  """The loop books what the feed waited for as `time/total/input`: here every batch, read 0.25 s late."""
  _slow_stream(monkeypatch, 0.25)  # Far longer than a step, even on a loaded machine.
  config.num_train_steps, config.eval_every_steps, config.checkpoint_every_steps = 10, 10, 10
  train.train_and_evaluate(config, str(tmp_path))
  # At most 4 batches are read ahead while the step compiles: the other 6 are waited for, 0.25 s less a step each,
  # and about 1.5 s in all; waits counted from the run's start would sum to over 5 s.
  assert 0.6 <= metrics.read(str(tmp_path))[-1]["time/total/input"] <= 4.0


def test_every_log_record_says_what_share_of_the_step_time_waited_for_input(config, tmp_path, monkeypatch):
  """`perf/input_wait`: the share of the loop's step time (its steps and its waits for input) since the previous
  log record that went to waiting for input; near 1 where every batch comes 0.25 s late, as here."""
  _slow_stream(monkeypatch, 0.25)
  config.num_train_steps, config.log_every_steps = 12, 2
  train.train_and_evaluate(config, str(tmp_path))
  logged = [r for r in metrics.read(str(tmp_path)) if "train/loss" in r]
  assert [r["step"] for r in logged] == [2, 4, 6, 8, 10, 12]
  assert all(0.0 <= r["perf/input_wait"] <= 1.0 for r in logged), logged
  # The batches read ahead while the step compiled are used up by step 6: each later step waits about 0.25 s for
  # its batch against a few ms of its own.
  assert logged[-1]["perf/input_wait"] > 0.5, logged[-1]


def test_the_input_wait_is_the_share_of_each_window_not_of_the_run(tmp_path):
  now = [0.0]
  clock = goodput.Clock(str(tmp_path), goodput.CompileWatch(), clock=lambda: now[0])
  for train_s, input_s, share in ((3.0, 1.0, 0.25), (1.0, 0.0, 0.0), (0.0, 0.0, 0.0), (1.0, 4.0, 0.8)):
    with clock.span("train"):
      now[0] += train_s
    with clock.span("eval"):  # Not the loop's step time.
      now[0] += 7.0
    clock.add("input", input_s)
    assert clock.input_wait() == pytest.approx(share)


def test_tracing_counts_as_compilation_wherever_it_happens(config, tmp_path, monkeypatch):
  fingerprint = replicas._fingerprint

  def slow_to_trace(tree: object) -> jax.Array:
    time.sleep(1.5)  # Runs while the replica check's program is traced (at its first check only).
    return fingerprint(tree)

  monkeypatch.setattr(replicas, "_fingerprint", slow_to_trace)
  config.checkpoint_every_steps = 2  # Replica checks at steps 2 and 4 (the saves), inside the loop's training time.
  train.train_and_evaluate(config, str(tmp_path))
  last = metrics.read(str(tmp_path))[-1]
  assert last["time/total/compile"] >= 1.5 > last["time/total/train"], last


def test_nested_traces_count_once_as_compilation():
  trace, xla = "/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/backend_compile_duration"
  with goodput.CompileWatch() as watch:
    monitoring.record_event_time_span(trace, 10.0, 11.0)  # An inner jit, traced inside its caller's trace,
    monitoring.record_event_time_span(trace, 9.0, 12.0)   # which ends after it.
    monitoring.record_event_time_span(xla, 12.0, 14.0)
    monitoring.record_event_time_span("/jax/some/other_duration", 0.0, 100.0)
    monitoring.record_event_duration_secs(xla, 2.0)
  assert (watch.busy, watch.seconds, watch.programs) == (5.0, 2.0, 1)


def test_profile_steps_write_a_trace(config, tmp_path):
  config.profile_steps = (2, 3)
  train.train_and_evaluate(config, str(tmp_path))
  assert glob.glob(str(tmp_path / "plugins" / "profile" / "*" / "*.xplane.pb"))


@pytest.mark.parametrize("steps", [(3, 2), (0, 2), (1,)])
def test_bad_profile_steps_are_named(config, tmp_path, steps):
  config.profile_steps = steps
  with pytest.raises(config_lib.ConfigError, match="profile_steps"):
    train.train_and_evaluate(config, str(tmp_path))


def test_a_program_read_from_the_persistent_cache_is_counted_as_such(tmp_path):
  """The start summary's compile line says how many programs came from the cache: a restart should compile none."""
  from jax.experimental.compilation_cache import compilation_cache as jax_cache
  before = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
  try:
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax_cache.reset_cache()
    with goodput.CompileWatch() as watch:
      for _ in range(2):
        jax.clear_caches()  # The second compile finds the program only in the persistent cache.
        jax.jit(lambda x: x * 3.0 + 1.0)(np.arange(5.0, dtype=np.float32)).block_until_ready()
    assert (watch.programs, watch.cache_hits) == (2, 1)
    assert watch.describe().endswith(" for 2 programs (1 from the persistent cache)"), watch.describe()
  finally:
    jax.config.update("jax_compilation_cache_dir", before[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
    jax_cache.reset_cache()


def test_jaxdp_turns_the_compilation_cache_on_unless_jax_has_a_directory_or_has_it_off(tmp_path, monkeypatch):
  from jax.experimental.compilation_cache import compilation_cache as jax_cache
  before = jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache
  monkeypatch.setattr(process, "DEFAULT_CACHE_DIR", str(tmp_path / "default"))
  try:
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "users"))  # JAX_COMPILATION_CACHE_DIR's.
    process.use_compilation_cache()
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "users")  # The user's rules ...
    jax.config.update("jax_compilation_cache_dir", None)
    jax.config.update("jax_enable_compilation_cache", False)  # JAX_ENABLE_COMPILATION_CACHE=false.
    process.use_compilation_cache()
    assert jax.config.jax_compilation_cache_dir is None  # ... off stays off ...
    jax.config.update("jax_enable_compilation_cache", True)
    process.use_compilation_cache()
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "default")  # ... else jaxdp's directory.
  finally:
    jax.config.update("jax_compilation_cache_dir", before[0])
    jax.config.update("jax_enable_compilation_cache", before[1])
    jax_cache.reset_cache()  # Opened anew, at the next compile, where it was.
