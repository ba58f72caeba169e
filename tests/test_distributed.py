"""Setup mistakes end in exactly one `error:` line on stderr and exit status 2, not a traceback or an abort."""

import inspect
import os
import socket
import subprocess
import sys
import time

import pytest

from jaxdp.loop import preemption
from jaxdp import train
from jaxdp.configs import default, mlp_digits


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


def test_preemption_sync_every_steps_acts_only_without_the_preemption_service_as_documented(monkeypatch):
  calls = []
  monkeypatch.setattr(preemption.jax, "process_count", lambda: 2)
  monkeypatch.setattr(preemption.multihost_utils, "reached_preemption_sync_point",
                      lambda step: calls.append(("service", step)) or False)
  monkeypatch.setattr(preemption.multihost_utils, "process_allgather", lambda flags: calls.append(("gather",)) or flags)
  before = preemption.jax.config.jax_enable_preemption_service
  try:
    for service in (True, False):
      preemption.jax.config.update("jax_enable_preemption_service", service)
      watcher = preemption.Watcher(sync_every_steps=3)
      assert not any(watcher.should_stop(step) for step in range(1, 7))
  finally:
    preemption.jax.config.update("jax_enable_preemption_service", before)
  assert calls == [("service", s) for s in range(1, 7)] + [("gather",)] * 2  # Every step; then steps 3 and 6.
  source = inspect.getsource(default)
  comment = source[:source.index("config.preemption_sync_every_steps")].splitlines()[-3:-1]
  assert "preemption_service off only" in comment[0] and "does nothing" in comment[1], comment
