"""The CLI: bad input gives one `error: ...` line naming the value, exit status 2, before training."""

import os
import subprocess
import sys

import pytest

from jaxdp import train
from jaxdp.configs import default

CONFIG = default.__file__


def _run(argv, capsys):
  status = train.main(["jaxdp.train", *argv])
  return status, capsys.readouterr().err.strip()


@pytest.mark.parametrize("override, named", [
    ("--config.batch_size=30", "30"),                       # Not divisible by 8 devices.
    ("--config.model.name=resnet9000", "resnet9000"),
    ("--config.dataset.name=no_such_dataset", "no_such_dataset"),
    ("--config.nokey=1", "config.nokey"),
    ("--config.learning_rate=0.0", "0.0"),
    ("--config.learning_rate=-0.1", "-0.1"),
    ("--config.num_train_steps=0", "0"),
    ("--config.parallel.backend=horovod", "horovod"),
    ("--config.optimizer=adagrad9", "adagrad9"),
    ("--config.batch_size=abc", "abc"),
])
def test_config_mistakes(data_dir, tmp_path, capsys, override, named):
  workdir = tmp_path / "run"
  status, err = _run(["--config", CONFIG, "--workdir", str(workdir), f"--config.dataset.data_dir={data_dir}",
                      override], capsys)
  assert status == 2
  assert err.startswith("error: ") and len(err.splitlines()) == 1, err
  assert named in err
  assert not (workdir / "metrics.jsonl").exists()  # Nothing trained.


def test_missing_config_file(tmp_path, capsys):
  status, err = _run(["--config", str(tmp_path / "nope.py"), "--workdir", str(tmp_path)], capsys)
  assert status == 2 and err.startswith("error: ") and "nope.py" in err and len(err.splitlines()) == 1


def test_unwritable_workdir(data_dir, tmp_path, capsys):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  status, err = _run(["--config", CONFIG, "--workdir", str(blocker / "run"),
                      f"--config.dataset.data_dir={data_dir}"], capsys)
  assert status == 2 and "a_file" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv, named", [
    (["--config", "missing_config.py"], "missing_config.py"),
    (["--config", CONFIG, "--config.model.nme=mlp"], "config.model.nme"),
])
def test_cli_process_exits_2_without_traceback(tmp_path, argv, named):
  env = {**os.environ, "JAXDP_CPU_DEVICES": "2"}
  proc = subprocess.run([sys.executable, "-m", "jaxdp.train", *argv, "--workdir", str(tmp_path)],
                        capture_output=True, text=True, env=env, timeout=120)
  assert proc.returncode == 2, proc.stderr
  assert "Traceback" not in proc.stderr
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and named in errors[0], proc.stderr
