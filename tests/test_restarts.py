"""jaxdp.launch restarts a failed group by itself, and goes on with fewer processes when a rank is gone.

Each run is 2 processes x 2 devices in invariant mode, so that the elastic run (ending on 1 x 2) can be
compared bitwise with the uninterrupted 2 x 2 run as well as the restarted one (2 per process, not more: the
count is not the point, and each device adds to every restarted group's compile and steps).
"""

import functools
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
import runs

from jaxdp.tools import audit
from jaxdp import checkpoint, data, models, optim, parallel
from jaxdp.report import metrics
from jaxdp import step as step_lib

STEPS, EVERY = 60, 10  # Steps of each run (the last kill is at step 40 at most); a checkpoint every EVERY steps.
# Exits rank 1 at interpreter start once the marker file exists: a host that is gone (a test hook, not jaxdp's).
GONE_HOOK = """import os
if os.environ.get("JAXDP_PROCESS_ID") == "1" and os.path.exists(os.environ.get("JAXDP_TEST_GONE_MARKER", "/-")):
  os._exit(3)
"""


def _overrides(data_dir: str) -> dict:
  return {"dataset.data_dir": data_dir, "model.name": "mlp", "model.hidden": (32,), "batch_size": 64,
          "num_train_steps": STEPS, "log_every_steps": 1, "eval_every_steps": STEPS, "checkpoint_every_steps": EVERY,
          "audit_data": True, "parallel.invariant": True}


def _launch(workdir, data_dir, *launcher_flags, **env) -> subprocess.Popen:
  args = ["--num_processes", "2", "--devices_per_process", "2", *launcher_flags, "--",
          *runs.flags(_overrides(data_dir)), "--workdir", str(workdir)]
  full_env = {**os.environ, **env}
  return subprocess.Popen([sys.executable, "-m", "jaxdp.launch", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=full_env, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[str, str]:
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)  # The launcher; its trainers die with it.
    raise
  assert proc.returncode == 0, out[-3000:] + err[-3000:]
  return out, err


def _steps_after(path, offset: int) -> list[int]:
  """Steps of the records appended to metrics.jsonl after byte `offset` (a line being written is skipped)."""
  try:
    with open(path) as f:
      f.seek(offset)
      lines = f.read().splitlines()
  except OSError:
    return []
  steps = []
  for line in lines:
    try:
      steps.append(json.loads(line)["step"])
    except (ValueError, KeyError):
      continue
  return steps


def _kill_when(workdir, proc, target: int, dead: set[int], rank: int | None = None, before=None) -> int:
  """Waits for a new group (pids not in `dead`) to log a step >= `target`, then SIGKILLs one of its ranks."""
  runs.wait_for(lambda: proc.poll() is not None or (len(runs.trainer_pids(workdir)) == 2
                                                   and not set(runs.trainer_pids(workdir).values()) & dead), every=0.05)
  assert proc.poll() is None, proc.communicate()
  group = runs.trainer_pids(workdir)
  path = workdir / "metrics.jsonl"
  offset = path.stat().st_size if path.exists() else 0  # Only this group's records count.
  runs.wait_for(lambda: proc.poll() is not None or max(_steps_after(path, offset), default=-1) >= target,
                timeout=240, every=0.005)
  assert proc.poll() is None, proc.communicate()
  if before:
    before()
  time.sleep(random.uniform(0, 0.05))  # Between steps, inside one, or inside a checkpoint save.
  rank = random.randrange(2) if rank is None else rank
  os.kill(group[rank], signal.SIGKILL)
  dead.update(group.values())
  return rank


def _final(workdir, data_dir) -> dict:
  """The final checkpoint's parameters and optimizer state (on the host), and the last eval and train metrics."""
  config = runs.config_with(_overrides(data_dir))
  backend = parallel.make_backend("mesh")
  ds = data.load(config.dataset)
  model = models.get_model(config.model, ds.input_shape, ds.num_classes)
  init = functools.partial(step_lib.init_state, jax.random.PRNGKey(config.seed), model=model, tx=optim.make(config))
  with checkpoint.Checkpointer(str(workdir), config) as ckpt:
    assert ckpt.latest_step() == STEPS
    state = ckpt.restore_or_init(backend, init)
  records = metrics.read(str(workdir))
  evals = [r for r in records if "eval/loss" in r]
  return {"state": backend.get({"params": state.params, "opt_state": state.opt_state}),
          "eval": {k: v for k, v in evals[-1].items() if k.startswith("eval/")},
          "losses": {r["step"]: r["train/loss"] for r in records if "train/loss" in r}}  # The last run's per step.


def _assert_same_run(a: dict, b: dict) -> None:
  runs.assert_bitwise(a["state"], b["state"])
  assert a["eval"] == b["eval"] and a["losses"] == b["losses"]


@pytest.fixture(scope="module")
def uninterrupted(data_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("uninterrupted")
  _finish(_launch(workdir, data_dir))
  return _final(workdir, data_dir)


def test_three_sigkills_are_restarted_and_the_run_ends_bitwise_as_if_uninterrupted(data_dir, tmp_path, uninterrupted):
  proc = _launch(tmp_path, data_dir, "--max_restarts", "3")
  dead, killed = set(), []
  for i in range(3):  # At a random step of each group (well before the end), a random rank.
    killed.append(_kill_when(tmp_path, proc, i * EVERY + random.randint(1, 2 * EVERY), dead))
  _, err = _finish(proc)
  lines = [l for l in err.splitlines() if l.startswith("launch: ")]
  assert len(lines) == 3, err
  for i, (line, rank) in enumerate(zip(lines, killed), 1):
    assert re.fullmatch(rf"launch: process {rank} of 2 was lost \(killed by SIGKILL\); restart {i} of 3 "
                        rf"from (step \d+0|the start \(no checkpoint yet\))", line), line
  _assert_same_run(_final(tmp_path, data_dir), uninterrupted)
  assert audit.main(["audit", str(tmp_path)]) == 0  # Every example exactly once, across the restarts.
  last = [r for r in metrics.read(str(tmp_path)) if "time/total/restart" in r][-1]
  assert last["time/total/restart"] > 0 and last["time/goodput"] < 1, last  # The time lost is counted.


def test_a_rank_that_cannot_start_again_is_left_out_and_the_run_ends_bitwise_on_one_process(
    data_dir, tmp_path, uninterrupted):
  hooks = tmp_path / "hooks"
  hooks.mkdir()
  (hooks / "sitecustomize.py").write_text(GONE_HOOK)
  marker = tmp_path / "rank1-gone"
  workdir = tmp_path / "run"
  pythonpath = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
  proc = _launch(workdir, data_dir, "--max_restarts", "3", "--min_processes", "1", PYTHONPATH=pythonpath,
                 JAXDP_TEST_GONE_MARKER=str(marker))
  def gone() -> None:  # Once a checkpoint is complete (saves are asynchronous): the restart is from a step.
    runs.wait_for(lambda: checkpoint.steps(str(workdir)), timeout=120, every=0.005)
    marker.touch()

  _kill_when(workdir, proc, random.randint(EVERY + 1, 4 * EVERY), set(), rank=1, before=gone)
  out, err = _finish(proc)
  lines = [l for l in err.splitlines() if l.startswith("launch: ")]
  assert re.fullmatch(r"launch: process 1 of 2 was lost \(killed by SIGKILL\); restart 1 of 3 from step \d+0",
                      lines[0]), err
  assert re.fullmatch(r"launch: process 1 of 2 exited with status 3 again before joining the run: it cannot be "
                      r"restarted; going on with 1 of 2; restart 2 of 3 from step \d+0", lines[-1]), err
  assert len(lines) == 2, err
  assert "[1] " not in out.split("restart 2 of 3")[-1]
  _assert_same_run(_final(workdir, data_dir), uninterrupted)
  assert audit.main(["audit", str(workdir)]) == 0
