"""jaxdp from Python behaves as from the command line: JAXDP_CPU_DEVICES and a late config.cpu_devices, the status
lines (resumed, preempted, nothing to train) printed and carried by the Result, evaluate() on a workdir's own config,
a random-access source identified by its files."""

import os
import subprocess
import sys

import numpy as np
import pytest

from jaxdp import train
from jaxdp.loop import preemption
from jaxdp.report import metrics
from jaxdp.tools import evaluate

RUN = ("import sys, jax, jaxdp; from jaxdp.configs import default; c = default.get_config(); "
       "c.dataset.data_dir, c.model.name, c.batch_size, c.num_train_steps = sys.argv[1], 'mlp', 32, 2; "
       "c.eval_every_steps = c.log_every_steps = 2; c.checkpoint_every_steps = 0; {before}"
       "jaxdp.train_and_evaluate(c, sys.argv[2]); print('devices', jax.device_count())")


def _python(code: str, data_dir: str, workdir, **env: str) -> subprocess.CompletedProcess:
  clean = {k: v for k, v in os.environ.items() if k not in ("JAXDP_CPU_DEVICES", "XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
  return subprocess.run([sys.executable, "-c", code, data_dir, str(workdir)], capture_output=True, text=True,
                        timeout=300, env={**clean, "JAX_PLATFORMS": "cpu", **env})


def test_a_script_runs_on_the_jaxdp_cpu_devices_it_is_given(data_dir, tmp_path):
  proc = _python(RUN.format(before="c.cpu_devices = '1'; "), data_dir, tmp_path, JAXDP_CPU_DEVICES="4")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split()[-2:] == ["devices", "4"], proc.stdout[-2000:]


def test_config_cpu_devices_after_jax_started_is_one_config_error(data_dir, tmp_path):
  proc = _python(RUN.format(before="jax.numpy.zeros(1); c.cpu_devices = '3'; "), data_dir, tmp_path)
  assert proc.returncode == 1 and "devices" not in proc.stdout
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("jaxdp.config.ConfigError: config.cpu_devices='3' comes too late: JAX already runs on 1 "
                         "cpu device(s)"), proc.stderr[-2000:]


@pytest.fixture
def finished(config, tmp_path):
  config.num_train_steps, config.eval_every_steps, config.checkpoint_every_steps = 4, 4, 4
  return config, str(tmp_path), train.train_and_evaluate(config, str(tmp_path))


def test_a_finished_workdir_says_nothing_to_train_and_returns_its_last_eval(finished, capsys):
  config, workdir, first = finished
  assert first.resumed_from is None and first.eval_metrics
  capsys.readouterr()
  again = train.train_and_evaluate(config, workdir)
  out = capsys.readouterr().out
  assert "resumed from step 4 (" in out and "; nothing to train: step 4 of 4" in out, out
  assert again.resumed_from == 4 and again.eval_metrics == first.eval_metrics


def test_a_preempted_run_says_where_and_the_result_carries_it(config, tmp_path, capsys, monkeypatch):
  config.num_train_steps, config.checkpoint_every_steps = 6, 6
  monkeypatch.setattr(preemption.Watcher, "should_stop", lambda self, step: step == 3)
  stopped = train.train_and_evaluate(config, str(tmp_path))
  assert "step 3: stop requested; checkpoint saved, exiting (preempted at step 3)" in capsys.readouterr().out
  assert stopped.preempted and stopped.preempted_at == 3 and stopped.resumed_from is None
  monkeypatch.undo()
  resumed = train.train_and_evaluate(config, str(tmp_path))
  assert "resumed from step 3 (" in capsys.readouterr().out
  assert resumed.resumed_from == 3 and resumed.preempted_at is None and not resumed.preempted


def test_evaluate_without_a_config_takes_the_workdirs(finished):
  _, workdir, first = finished
  step, results = evaluate.evaluate(workdir=workdir)
  assert step == 4 and results["eval/loss"] == first.eval_metrics["eval/loss"]
  assert results["eval/loss"] == [r for r in metrics.read(workdir) if "eval/loss" in r][-1]["eval/loss"]


class FileRows:
  """A random-access source over a .npy file of 200 rows of 64 floats: names its files (`paths`)."""

  def __init__(self, path: str):
    self.paths, self.rows = [path], np.load(path)

  def __len__(self) -> int:
    return len(self.rows)

  def __getitem__(self, i: int) -> dict:
    return {"inputs": self.rows[i].reshape(8, 8, 1), "labels": np.int64(i % 10)}


def test_a_file_source_whose_unsampled_row_changed_is_refused_on_resume(config, tmp_path):
  from jaxdp.config import ConfigError
  path = str(tmp_path / "rows.npy")
  np.save(path, np.random.default_rng(0).random((200, 64), np.float32))
  config.num_train_steps, config.checkpoint_every_steps = 2, 2
  held_out = {"inputs": np.zeros((16, 8, 8, 1), np.float32), "labels": np.arange(16) % 10}
  train.train_and_evaluate(config, str(tmp_path / "w"), train_data=FileRows(path), eval_data=held_out)
  rows = np.load(path)
  rows[1] += 1  # Row 1 is none of the 64 rows a source without an identity is sampled at.
  np.save(path, rows)
  os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))  # A later mtime, whatever the clock.
  config.num_train_steps = 4
  with pytest.raises(ConfigError, match="input stream differs .*dataset '<in-memory>@"):
    train.train_and_evaluate(config, str(tmp_path / "w"), train_data=FileRows(path), eval_data=held_out)


def _species():
  """A Hugging Face-like in-memory split: numeric columns and a string column `species`."""
  rng = np.random.default_rng(0)
  return {"inputs": rng.random((40, 4), np.float32), "labels": np.arange(40) % 3,
          "species": np.array(["setosa", "versicolor", "virginica"] * 13 + ["setosa"])}


def test_the_summary_lists_the_features_held_and_those_left_out_with_why(config, tmp_path, capsys):
  config.num_train_steps = 1
  train.train_and_evaluate(config, str(tmp_path), train_data=_species(), eval_data=_species())
  line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("features"))
  assert "inputs (4,) float32, labels () int32; left out: species (text or bytes: no array type on a device" in line


def test_a_task_reading_a_left_out_feature_is_one_error_naming_it_and_why(config, tmp_path):
  from jaxdp.config import ConfigError

  def by_species(model, batch):
    return ((model(batch["inputs"]).sum(-1) - (batch["species"] == "setosa")) ** 2, {})

  with pytest.raises(ConfigError, match="the task reads feature 'species', which batches leave out: text or bytes"):
    train.train_and_evaluate(config, str(tmp_path), task=by_species, train_data=_species(), eval_data=_species())
