"""Progress: exact throughput, step time, MFU and ETA from the clock; plain lines when not a terminal;
the start summary; the CLI's output when it is piped."""

import functools
import io
import logging
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxdp import config as config_lib
from jaxdp import data, models, parallel
from jaxdp.loop import goodput
from jaxdp.report import progress, summary, units
from jaxdp.configs import default

TRAIN_LINE = re.compile(r"^step +\d+/\d+ +\d+% \| loss \d+\.\d{4} \| acc \d+\.\d% \| [\d,]+ ex/s \([\d,]+/device\) "
                        r"\| \d+\.\d ms/step \| ETA \d+:\d\d:\d\d$")
EVAL_LINE = re.compile(r"^step +\d+/\d+ eval \| loss \d+\.\d{4} \| acc \d+\.\d% \| [\d,]+ examples$")


class Clock:
  """A clock the test moves by hand."""

  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def _reporter(clock, stream, interactive=False, **kw):
  return progress.Reporter(10, 0, 64, 8, flops_per_step=1e9, peak_flops=1e12, stream=stream,
                           interactive=interactive, enabled=True, clock=clock, **kw)


@pytest.fixture
def bar_reporter():
  """Makes reporters on a terminal whose bar is redrawn at every step (no rate limit), so a test sees each draw.

  Each is closed after the test, also a failed one: an open tqdm bar would move the next test's bar to line 2.
  """
  made = []

  def make(clock, stream, start_step=0):
    made.append(progress.Reporter(10, start_step, 64, 8, flops_per_step=1e9, peak_flops=1e12, stream=stream,
                                  interactive=True, enabled=True, clock=clock, redraw_seconds=0))
    return made[-1]

  yield make
  for reporter in made:
    reporter.close()


def _screen(text):
  """What a terminal shows after `text`: a carriage return goes back to the line's start, what follows overwrites."""
  assert "\x1b" not in text  # The bar on one line needs no cursor movement.
  lines, col = [[]], 0
  for char in text:
    if char == "\n":
      lines.append([])
      col = 0
    elif char == "\r":
      col = 0
    else:
      line = lines[-1]
      line[col:col + 1] = [char]
      col += 1
  return ["".join(line).rstrip() for line in lines]


def test_throughput_mfu_and_eta_from_the_clock_with_eval_excluded():
  clock, out = Clock(), io.StringIO()
  reporter = _reporter(clock, out)
  for step in range(1, 5):  # Step 1's dispatch starts the clock; steps 2..4 take 1.5 s each.
    reporter.on_step(step)
    clock.now += 1.5
  clock.now -= 1.5
  perf = reporter.on_log(4, {"train/loss": 0.5, "train/accuracy": 0.75})
  assert perf == pytest.approx({"perf/step_time": 1.5, "perf/examples_per_second": 64 / 1.5,
                                "perf/examples_per_second_per_device": 8 / 1.5, "perf/mfu": 1e9 / 1.5 / 1e12})
  assert reporter.eta_seconds(4) == pytest.approx(6 * 1.5)
  clock.now += 100.0  # A long eval: not training time.
  reporter.on_eval(4, {"eval/loss": 0.25, "eval/accuracy": 0.875, "eval/num_examples": 360})
  for step in (5, 6):
    clock.now += 0.5
    reporter.on_step(step)
  perf = reporter.on_log(6, {"train/loss": 0.4, "train/accuracy": 0.8})
  assert perf["perf/step_time"] == pytest.approx(0.5)
  assert reporter.eta_seconds(6) == pytest.approx(4 * (3 * 1.5 + 2 * 0.5) / 5)
  lines = out.getvalue().splitlines()
  assert lines[0] == "step  4/10  40% | loss 0.5000 | acc 75.0% | 43 ex/s (5/device) | 1500.0 ms/step | MFU 0.1% | ETA 0:00:09"
  assert lines[1] == "step  4/10 eval | loss 0.2500 | acc 87.5% | 360 examples"
  assert lines[2].startswith("step  6/10  60% | loss 0.4000 | acc 80.0% | 128 ex/s (16/device) | 500.0 ms/step")
  assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_first_log_at_the_first_step_has_no_throughput_yet():
  clock, out = Clock(), io.StringIO()
  reporter = _reporter(clock, out)
  reporter.on_step(1)
  assert reporter.on_log(1, {"train/loss": 1.0}) == {}
  assert reporter.eta_seconds(1) is None
  assert out.getvalue() == "step  1/10  10% | loss 1.0000\n"
  reporter.done()  # A run that stopped before any timed step: no average to print.
  assert out.getvalue() == "step  1/10  10% | loss 1.0000\n"


def test_terminal_gets_a_bar_redrawn_in_place_with_jaxdps_figures(bar_reporter):
  clock, out = Clock(), io.StringIO()
  reporter = bar_reporter(clock, out)
  for step in range(1, 4):  # Step 1 starts the clock; steps 2 and 3 take 1 s each.
    reporter.on_step(step)
    clock.now += 1.0
  text = out.getvalue()
  assert "\n" not in text and text.count("\r") >= 3  # Each draw goes back to the start of the same line.
  bar = _screen(text)
  assert len(bar) == 1 and bar[0].startswith("step  3/10  30% |###"), bar
  # jaxdp's own figures from its clock (1 s per step so far), not tqdm's rate: MFU 1e9 / 1 s / 1e12 FLOP/s.
  assert bar[0].endswith("| 64 ex/s | 1000.0 ms/step | MFU 0.1% | ETA 0:00:07"), bar
  clock.now -= 1.0  # The metrics of step 3 arrive as it ends.
  reporter.on_log(3, {"train/loss": 0.5})
  assert _screen(out.getvalue())[-1].startswith("step  3/10  30% |###       | loss 0.5000 | ")  # The new loss.
  reporter.on_step(4)
  reporter.on_eval(4, {"eval/loss": 0.25, "eval/accuracy": 0.875, "eval/num_examples": 360})
  screen = _screen(out.getvalue())
  assert screen[0] == "step  3/10  30% | loss 0.5000 | 64 ex/s (8/device) | 1000.0 ms/step | MFU 0.1% | ETA 0:00:07"
  assert screen[1] == "step  4/10 eval | loss 0.2500 | acc 87.5% | 360 examples"
  # Below them the bar, with the new loss; no time has passed since the eval: the average step time so far.
  assert screen[2:] == ["step  4/10  40% |####      | loss 0.5000 | 64 ex/s | 1000.0 ms/step | MFU 0.1% | ETA 0:00:06"]


def test_a_resumed_run_s_bar_starts_at_its_first_step(bar_reporter):
  clock, out = Clock(), io.StringIO()
  reporter = bar_reporter(clock, out, start_step=6)
  reporter.on_step(7)
  assert _screen(out.getvalue()) == ["step  7/10  70% |#######   |"]
  assert "step  0/10" not in out.getvalue()  # Not even a first draw from step 0.


def test_log_records_on_the_console_do_not_break_the_bar(monkeypatch, bar_reporter):
  clock, out = Clock(), io.StringIO()
  monkeypatch.setattr(sys, "stdout", out)  # The CLI logs to stdout, where the bar is.
  handler = logging.StreamHandler(out)
  monkeypatch.setattr(logging.root, "handlers", [handler])
  reporter = bar_reporter(clock, out)
  reporter.on_step(1)
  logging.getLogger("jaxdp").warning("step 1: stop requested")
  assert _screen(out.getvalue()) == ["step 1: stop requested", "step  1/10  10% |#         |"]
  reporter.close()
  assert logging.root.handlers == [handler]  # The console handler is back once the bar is gone.


def test_only_process_0_prints(monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  out = io.StringIO()
  reporter = progress.Reporter(10, 0, 64, 8, stream=out, interactive=True)  # Not even a bar on a terminal.
  reporter.on_step(1)
  reporter.on_log(2, {"train/loss": 1.0})
  reporter.close()
  summary.report({"devices": "x"}, stream=out)
  assert out.getvalue() == ""


def test_summary_describes_the_run(config):
  backend = parallel.make_backend("mesh")
  layout = config_lib.validate(config, backend.num_devices, 1)
  ds = data.load(config.dataset)
  model = models.get_model(config.model, ds.input_shape, ds.num_classes)
  lines = summary.describe(config, backend, layout, ds, model)
  params, _ = model.init(jax.random.PRNGKey(0))
  count = sum(x.size for x in jax.tree.leaves(params))
  nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  n_train, n_eval = ds.num_examples("train"), ds.num_examples("test")
  assert summary.parameter_size(model) == (count, nbytes)
  assert f"{count:,} parameters" in lines["model"]
  assert lines["devices"].startswith(f"{jax.device_count()} x cpu")
  assert f"global 32 = {jax.device_count()} devices x {32 // jax.device_count()}" in lines["batch"]
  assert f"{n_train:,} examples" in lines["data"] and f"{n_eval:,}" in lines["data"]
  assert f"{n_train // 32} per epoch" in lines["schedule"]
  assert "'data': 8" in lines["backend"]
  config.num_train_steps = 1
  assert summary.describe(config, backend, layout, ds, model)["schedule"].startswith("1 step, ")


@pytest.mark.parametrize("processes", [1, 2])
def test_summary_names_processes_and_their_batch_and_the_epochs_to_a_tenth(config, monkeypatch, processes):
  monkeypatch.setattr(jax, "process_count", lambda: processes)
  backend = parallel.make_backend("mesh")
  layout = config_lib.validate(config, backend.num_devices, processes)
  ds = data.load(config.dataset)
  config.num_train_steps = 3 * (ds.num_examples("train") // 32) // 2  # One and a half epochs.
  lines = summary.describe(config, backend, layout, ds, models.get_model(config.model, ds.input_shape, 10))
  assert lines["schedule"].endswith("(= 1.5 epochs)")
  if processes == 1:
    assert "; 1 process; this one has 8 of the 8 devices it can see" in lines["devices"]
    assert "per process" not in lines["batch"]
  else:
    assert "; 2 processes of 8 devices; this one has 8 of the 8" in lines["devices"]
    assert "global 32 = 8 devices x 4 (16 per process);" in lines["batch"]


def test_cli_output_when_not_a_terminal(data_dir, tmp_path):
  workdir = tmp_path / "run"
  env = {**os.environ, "JAXDP_CPU_DEVICES": "4", "TF_CPP_MIN_LOG_LEVEL": "3"}
  proc = subprocess.run(
      [sys.executable, "-m", "jaxdp.train", "--config", default.__file__, "--workdir", str(workdir),
       f"--config.dataset.data_dir={data_dir}", "--config.model.name=mlp", "--config.batch_size=32",
       "--config.num_train_steps=6", "--config.log_every_steps=2", "--config.eval_every_steps=6",
       "--config.checkpoint_every_steps=0"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=180, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout
  assert "\r" not in out and "\x1b" not in out  # No bar in a log file.
  lines = out.splitlines()
  assert lines[0] == "jaxdp"
  topics = [line.split()[0] for line in lines[1:15]]
  assert topics == ["devices", "backend", "batch", "model", "data", "task", "features", "schedule", "cpu_devs",
                    "state", "input", "compute", "compile"] + ["step"], out
  assert lines[1].split()[1:3] == ["4", "x"]
  assert "global 32 = 4 devices x 8" in lines[3]
  assert lines[9].split()[1:4] == ["4:", "asked", "for"], out  # JAXDP_CPU_DEVICES, not config.cpu_devices.
  progress_lines = lines[14:]
  assert [line.split()[1] for line in progress_lines[:-2]] == ["2/6", "4/6", "6/6", "6/6"], out
  assert all(TRAIN_LINE.match(line) for line in progress_lines[:3]), out
  assert EVAL_LINE.match(progress_lines[3]), out
  assert progress_lines[-2].startswith("done | ") and progress_lines[-1].startswith("time | "), out
  assert (workdir / "metrics.jsonl").exists() and list(workdir.glob("events.out.tfevents.*"))


def test_untimed_work_is_left_out_of_the_step_time_and_the_eta(tmp_path):
  clock, out = Clock(), io.StringIO()
  timer = goodput.Clock(str(tmp_path), goodput.CompileWatch(), clock=clock)  # The loop's one timer of its blocks.
  reporter = _reporter(clock, out, untimed_seconds=timer.between_steps)
  reporter.on_step(1)
  for step in (2, 3):
    clock.now += 1.0
    reporter.on_step(step)
    with timer.span("checkpoint") as span:  # A checkpoint save after each step.
      clock.now += 30.0
    assert span.seconds == 30.0
  perf = reporter.on_log(3, {"train/loss": 0.5})
  assert perf["perf/step_time"] == pytest.approx(1.0)
  assert reporter.eta_seconds(3) == pytest.approx(7 * 1.0)


def test_close_clears_a_bar_left_on_the_terminal_and_done_prints_the_average(bar_reporter):
  clock, out = Clock(), io.StringIO()
  reporter = bar_reporter(clock, out)
  reporter.on_step(1)
  clock.now += 2.0
  reporter.on_step(2)
  assert _screen(out.getvalue())[-1].startswith("step  2/10")
  reporter.close()  # An exception after step 2: no bar left behind.
  assert out.getvalue().endswith("\r") and _screen(out.getvalue()) == [""]
  reporter.on_log(2, {"train/loss": 0.5})
  reporter.done()
  assert _screen(out.getvalue())[-2:] == ["done | 32 ex/s on average | 2000.0 ms/step over 1 timed steps (0:00:02)", ""]


def test_a_finished_run_leaves_its_lines_and_no_bar(bar_reporter):
  clock, out = Clock(), io.StringIO()
  reporter = bar_reporter(clock, out)
  for step in range(1, 11):
    clock.now += 0.5
    reporter.on_step(step)
  reporter.on_log(10, {"train/loss": 0.25})
  reporter.done()
  reporter.note("time | 0:00:05 wall")
  reporter.close()
  assert _screen(out.getvalue()) == [
      "step 10/10 100% | loss 0.2500 | 128 ex/s (16/device) | 500.0 ms/step | MFU 0.2% | ETA 0:00:00",
      "done | 128 ex/s on average | 500.0 ms/step over 9 timed steps (0:00:04)", "time | 0:00:05 wall", ""]


def test_the_lines_show_the_task_s_headline_metrics_not_a_fixed_accuracy():
  clock, out = Clock(), io.StringIO()
  reporter = _reporter(clock, out, headline=("mse", "r2"))  # A regression's headline.
  reporter.on_step(1)
  reporter.on_log(1, {"train/loss": 0.5, "train/mse": 0.123456, "train/r2": 12.3456, "train/accuracy": 0.75})
  reporter.on_eval(1, {"eval/loss": 0.25, "eval/mse": 0.00012345, "eval/num_examples": 360})
  lines = out.getvalue().splitlines()
  assert lines[0] == "step  1/10  10% | loss 0.5000 | mse 0.1235 | r2 12.35"  # Not the accuracy it was given.
  assert lines[1] == "step  1/10 eval | loss 0.2500 | mse 0.0001234 | 360 examples"  # r2 absent: left out.


def test_headline_metrics_come_in_the_task_s_order_and_the_loss_once():
  assert progress.eval_line(2, 10, {"eval/loss": 1.0, "eval/b": 2.0, "eval/accuracy": 0.5},
                            headline=("loss", "b", "accuracy")) == "step  2/10 eval | loss 1.0000 | b 2 | acc 50.0%"
  assert progress.eval_line(2, 10, {"eval/loss": 1.0, "eval/accuracy": 0.5}, headline=()) == \
      "step  2/10 eval | loss 1.0000"


def test_numbers_read_as_people_write_them_at_each_unit_boundary():
  assert [units.si(x) for x in (999.0, 1e3, 1e9, 2.5e15)] == ["999 ", "1 k", "1 G", "2.5 P"]
  assert [units.binary_bytes(n) for n in (1023, 1024, 3 * 2**19, 2**30)] == ["1023 B", "1.0 KiB", "1.5 MiB", "1.0 GiB"]
  assert [units.duration(s) for s in (0.4, 59.6, 3725)] == ["0:00:00", "0:01:00", "1:02:05"]  # Rounded, not cut.


def test_skipped_steps_are_named_in_the_train_figures():
  assert "2 non-finite steps skipped" in progress.figures({"train/loss": 1.0, "train/nonfinite": 2.0}, {}, None,
                                                          per_device=False)
  assert not any("non-finite" in f for f in progress.figures({"train/nonfinite": 0.0}, {}, None, per_device=False))


def test_a_closed_stream_is_not_a_terminal():
  stream = io.StringIO()
  stream.close()  # isatty() on it raises ValueError.
  assert progress.is_terminal(stream) is False and progress.is_terminal(object()) is False
