"""The first multi-process run on a dataset that is not prepared yet: prepared once, every process reopens it."""

import os
import subprocess
import sys

import runs
import tensorflow_datasets as tfds

from jaxdp.report import metrics


def test_two_processes_prepare_an_unprepared_dataset_once_and_train(tmp_path):
  data_dir, workdir = tmp_path / "fresh_tfds", tmp_path / "run"  # Nothing prepared here yet.
  overrides = {"dataset.data_dir": str(data_dir), "model.name": "mlp", "model.hidden": (16,), "batch_size": 16,
               "num_train_steps": 2, "log_every_steps": 1, "eval_every_steps": 2, "checkpoint_every_steps": 2}
  args = ["--num_processes", "2", "--devices_per_process", "1", "--", *runs.flags(overrides), "--workdir", str(workdir)]
  proc = subprocess.run([sys.executable, "-m", "jaxdp.launch", *args], capture_output=True, text=True,
                        timeout=240)
  out = proc.stdout + proc.stderr
  assert proc.returncode == 0, out[-4000:]
  assert out.count("preparing dataset digits/") == 1, out[-4000:]  # One process prepared it.
  assert "Downloading and preparing dataset" not in out, out[-4000:]  # TFDS's own prints stay quiet.
  from jaxdp.datasets import digits  # noqa: F401  (defining its builder registers "digits" with TFDS)
  assert tfds.builder("digits", data_dir=str(data_dir)).is_prepared()
  records = metrics.read(str(workdir))
  assert [r["step"] for r in records if "train/loss" in r] == [1, 2]
  assert [r["eval/num_examples"] for r in records if "eval/loss" in r] == [360]
