"""`python -m jaxdp.plot`: a PNG of the curves of every metric one or more runs wrote."""

import json
import os
import shutil
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest

from jaxdp.tools import plot
from jaxdp import train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_dir):
  """A real (tiny) run with train and eval metrics at two steps."""
  from jaxdp.configs import default
  config = default.get_config()
  config.dataset.data_dir = data_dir
  config.model.name, config.model.hidden = "mlp", (32,)
  config.batch_size, config.num_train_steps, config.log_every_steps, config.eval_every_steps = 32, 4, 2, 2
  config.checkpoint_every_steps = 0  # Not what this test is about.
  workdir = str(tmp_path_factory.mktemp("plot") / "run")
  train.train_and_evaluate(config, workdir)
  return workdir


def _assert_png(path):
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  pixels = matplotlib.image.imread(path)
  assert pixels.shape[0] > 300 and pixels.shape[1] > 800
  assert np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0).shape[0] > 20  # Lines, text: not blank.


def test_plot_command_writes_a_png_next_to_the_run(run_dir):
  proc = subprocess.run([sys.executable, "-m", "jaxdp.plot", run_dir], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  out = os.path.join(run_dir, "curves.png")
  assert proc.stdout.strip() == out
  _assert_png(out)


def test_two_runs_in_one_png(run_dir, tmp_path):
  other = str(tmp_path / "other")
  shutil.copytree(run_dir, other)
  out = str(tmp_path / "pngs" / "both.png")
  assert plot.main([run_dir, other, "--out", out]) == 0
  _assert_png(out)


def test_curves_read_metrics_and_keep_the_last_value_of_a_repeated_step(run_dir, tmp_path):
  curves = plot.curves(run_dir)
  assert curves["train/loss"][0] == [2, 4] and curves["eval/accuracy"][0] == [2, 4]
  resumed = tmp_path / "resumed"
  resumed.mkdir()
  records = [{"step": 1, "train/loss": 3.0}, {"step": 2, "train/loss": 2.0}, {"step": 2, "train/loss": 1.0}]
  (resumed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  assert plot.curves(str(resumed))["train/loss"] == ([1, 2], [3.0, 1.0])


def test_a_run_without_metrics_is_one_error_line(tmp_path, capsys):
  assert plot.main([str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "metrics.jsonl" in err and len(err.splitlines()) == 1


def _write_metrics(workdir, records):
  workdir.mkdir()
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  return str(workdir)


def test_one_panel_per_metric_the_run_wrote_train_and_eval_together(tmp_path):
  records = [{"step": 2, "train/mse": 4.0, "train/loss": 4.0, "train/nonfinite": 0.0, "perf/step_time": 0.1},
             {"step": 2, "eval/mse": 3.0, "eval/r2": 0.1, "eval/loss": 3.0, "eval/num_examples": 90},
             {"step": 4, "train/mse": 2.0, "train/loss": 2.0, "train/my_metric": 7.0},
             {"step": 4, "eval/mse": 1.0, "eval/r2": 0.5, "eval/loss": 1.0, "eval/my_metric": 6.0}]
  run = _write_metrics(tmp_path / "regression", records)
  fig = plot.figure([run])
  shown = [ax for ax in fig.axes if ax.get_visible()]
  # The loss first, then the task's metrics as written; counts of the run itself and perf/ left out.
  assert [ax.get_title() for ax in shown] == ["loss", "mse", "r2", "my_metric"]
  by_title = {ax.get_title(): ax for ax in shown}
  assert [line.get_label() for line in by_title["mse"].lines] == ["regression train", "regression eval"]
  assert [list(line.get_ydata()) for line in by_title["mse"].lines] == [[4.0, 2.0], [3.0, 1.0]]
  assert [line.get_label() for line in by_title["r2"].lines] == ["regression eval"]  # Eval only.
  assert [list(line.get_xdata()) for line in by_title["my_metric"].lines] == [[4], [4]]
  out = str(tmp_path / "curves.png")
  assert plot.main([run, "--out", out]) == 0
  _assert_png(out)


def test_a_run_with_only_bookkeeping_counts_is_one_error_line(tmp_path, capsys):
  run = _write_metrics(tmp_path / "empty", [{"step": 1, "train/nonfinite": 0.0, "perf/step_time": 0.1}])
  assert plot.main([run]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: no train/ or eval/ metrics in") and len(err.splitlines()) == 1
