"""Setup mistakes end in exactly one `error:` line on stderr and exit status 2, not a traceback or an abort."""

import os
import socket
import subprocess
import sys
import time

import pytest

from jaxdp import train
from jaxdp.configs import mlp_digits


def _unused_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _flags(tmp_path, data_dir, *overrides) -> list[str]:
  return ["--config", mlp_digits.__file__, "--workdir", str(tmp_path), f"--config.dataset.data_dir={data_dir}",
          "--config.num_train_steps=2", *overrides]


def test_an_unreachable_coordinator_is_one_line_and_exit_2(tmp_path, data_dir):
  port = _unused_port()
  env = {**os.environ, "JAXDP_CPU_DEVICES": "1"}
  env.pop("XLA_FLAGS", None)
  started = time.time()
  proc = subprocess.run(
      [sys.executable, "-m", "jaxdp.train", *_flags(tmp_path, data_dir),
       f"--config.distributed.coordinator_address=127.0.0.1:{port}", "--config.distributed.num_processes=2",
       "--config.distributed.process_id=1", "--config.distributed.init_timeout_s=2"],
      env=env, capture_output=True, text=True, timeout=120)
  err = proc.stderr.strip()
  assert proc.returncode == 2, (proc.stdout, err)
  assert len(err.splitlines()) == 1 and err.startswith("error: coordinator 127.0.0.1:") and str(port) in err, err
  assert "init_timeout_s=2" in err and time.time() - started < 60


@pytest.mark.parametrize("override, named", [("--config.best_mode=minimum", "'minimum'"),
                                             ("--config.best_metric=train/loss", "'train/loss'")])
def test_a_bad_best_mode_or_best_metric_is_one_line_and_exit_2(tmp_path, data_dir, capsys, override, named):
  status = train.main(["jaxdp.train", *_flags(tmp_path, data_dir, "--config.keep_best_checkpoints=1", override)])
  err = capsys.readouterr().err.strip()
  assert status == 2 and len(err.splitlines()) == 1 and err.startswith("error: best_") and named in err, err
  assert not (tmp_path / "metrics.jsonl").exists()
