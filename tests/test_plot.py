"""`python -m jaxdp.plot`: a PNG of the loss and accuracy curves of one or more runs."""

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
  config.checkpoint_every_steps = config.check_replicas_every_steps = 0  # Not what this test is about.
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
