"""Real multi-process runs on 127.0.0.1 (jax.distributed, gloo): 2 processes x 4 devices vs 1 x 8, 2 x 1 to stop."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import same_training
import pytest
import runs

from jaxdp.tools import audit, launch
from jaxdp import checkpoint, parallel, train
from jaxdp.report import metrics

K = 20  # Steps before the checkpoint that the elastic restarts resume from; runs go to 2K.


def _overrides(data_dir, **more):
  return {"dataset.data_dir": data_dir, "model.name": "mlp", "num_train_steps": 2 * K, "log_every_steps": 1,
          "eval_every_steps": 2 * K, "checkpoint_every_steps": K, "audit_data": True,
          **more}


def _launch(workdir, overrides, processes=2, devices=4, **popen):
  """The launcher on `processes` x `devices`, its output captured."""
  # 2 x 4 is what the 1 x 8 reference is compared with; the tests that only stop or kill a group take 2 x 1: the
  # count is not their point, and each device of a process adds to its compile and steps.
  args = ["--num_processes", str(processes), "--devices_per_process", str(devices), "--",
          *runs.flags(overrides), "--workdir", str(workdir)]
  return subprocess.Popen([sys.executable, "-m", "jaxdp.launch", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True, **popen)


def _finish(proc, timeout=150):
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)  # The launcher and its processes: none outlives a failed test.
    raise
  assert proc.returncode == 0, out[-3000:] + err[-3000:]
  return out


def _assert_losses_close(a, b):
  assert a.keys() == b.keys() and a
  for step in a:
    assert a[step] == pytest.approx(b[step], rel=1e-4), step


@pytest.fixture(scope="module")
def one_by_eight(data_dir, tmp_path_factory):
  """The reference: 1 process x 8 devices, uninterrupted, in this process."""
  workdir = tmp_path_factory.mktemp("one_by_eight")
  result = train.train_and_evaluate(runs.config_with(_overrides(data_dir)), str(workdir))
  return workdir, result.backend.get(result.state.params)


@pytest.fixture(scope="module")
def two_by_four(data_dir, tmp_path_factory):
  """2 processes x 4 devices through the launcher, same config and seed."""
  workdir = tmp_path_factory.mktemp("two_by_four")
  out = _finish(_launch(workdir, _overrides(data_dir)))
  return workdir, out


def test_two_processes_train_like_one(data_dir, one_by_eight, two_by_four):
  (ref_dir, ref_params), (workdir, out) = one_by_eight, two_by_four
  _assert_losses_close(runs.train_losses(workdir), runs.train_losses(ref_dir))
  config = runs.config_with(_overrides(data_dir))
  # The 2-process checkpoint restores in 1 process (elastic), and its parameters match.
  backend = parallel.make_backend("mesh")
  state = checkpoint.Checkpointer(str(workdir), config).restore_or_init(backend, _init_for(config))
  params = backend.get(state.params)
  same_training.assert_same_training(params, ref_params)  # gloo's sums across processes round in another order.
  assert "steps' batches per transfer (nothing to decode)" in out  # Blocks of steps, each process its rows.
  assert "[0] step" in out and "[1] step" not in out  # Only process 0 reports progress ...
  steps = [r["step"] for r in metrics.read(str(workdir)) if "train/loss" in r]
  assert steps == sorted(set(steps))  # ... and writes each metrics line once.
  assert "[Gloo]" not in out and "connected to" not in out  # The launcher keeps gloo's connection lines out.
  assert audit.main(["audit", str(ref_dir), str(workdir)]) == 0  # The same global batches, step by step.
  [saves] = glob.glob(str(workdir / "audit" / "*.saves"))
  assert open(saves).read().split() == [str(K), str(2 * K)]  # Process 0's notes alone: each save once.
  headers = [json.load(open(f)) for f in sorted(glob.glob(str(workdir / "audit" / "*.p*.json")))]
  half = headers[0]["global_batch"] // 2
  assert [h["rows"] for h in headers] == [[0, half], [half, 2 * half]]  # Each process's rows of a batch.
  evals, ref_evals = _evals(workdir), _evals(ref_dir)  # Each process evaluates its own rows of every batch.
  assert evals.keys() == ref_evals.keys() and evals[2 * K]["eval/num_examples"] == 360
  for step, scalars in ref_evals.items():
    assert evals[step] == pytest.approx(scalars, rel=1e-4), step


def _evals(workdir) -> dict[int, dict[str, float]]:
  """step -> the eval scalars logged then."""
  return {r["step"]: {k: v for k, v in r.items() if k.startswith("eval/")}
          for r in metrics.read(str(workdir)) if "eval/loss" in r}


def _init_for(config):
  import functools
  from jaxdp import data, models, optim
  from jaxdp import step as step_lib
  ds = data.load(config.dataset)
  model = models.get_model(config.model, ds.input_shape, ds.num_classes)
  return functools.partial(step_lib.init_state, jax.random.PRNGKey(config.seed), model=model, tx=optim.make(config))


def test_resume_two_processes_on_one(data_dir, tmp_path, one_by_eight, two_by_four):
  shutil.copytree(two_by_four[0], tmp_path, dirs_exist_ok=True)
  shutil.rmtree(tmp_path / "checkpoints" / str(2 * K))  # Continue from step K, saved by 2 processes.
  train.train_and_evaluate(runs.config_with(_overrides(data_dir)), str(tmp_path))
  resumed = {s: l for s, l in runs.train_losses(tmp_path, K).items()}
  _assert_losses_close(resumed, runs.train_losses(one_by_eight[0], K))
  assert audit.main(["audit", str(tmp_path)]) == 0  # Exactly once: steps K+1..2K of 2 processes were rolled back.


def test_resume_one_process_on_two(data_dir, tmp_path, one_by_eight):
  train.train_and_evaluate(runs.config_with(_overrides(data_dir, num_train_steps=K)), str(tmp_path))
  _finish(_launch(tmp_path, _overrides(data_dir)))
  _assert_losses_close(runs.train_losses(tmp_path, K), runs.train_losses(one_by_eight[0], K))
  assert audit.main(["audit", str(tmp_path)]) == 0  # Exactly once across 1 x 8 then 2 x 4.


def _pid_of_rank(workdir, rank):
  """The pid of the jaxdp.train process with JAXDP_PROCESS_ID=rank running in `workdir`."""
  return runs.trainer_pids(workdir).get(rank)


def test_killing_one_process_stops_the_launcher_naming_it(data_dir, tmp_path):
  proc = _launch(tmp_path, _overrides(data_dir, num_train_steps=100000, checkpoint_every_steps=0), devices=1)
  runs.wait_for(lambda: (tmp_path / "metrics.jsonl").exists(), timeout=120, every=0.1)
  os.kill(_pid_of_rank(tmp_path, 1), signal.SIGKILL)
  killed = time.time()
  _, err = proc.communicate(timeout=60)
  assert proc.returncode != 0
  # The survivor cannot finish (the preemption service takes SIGTERM and waits for the lost one): it took
  # 10.5 s with the interrupt's grace; 1.4-1.7 s with launch.LOST_GRACE_S. The bound leaves room for a slow CI.
  assert time.time() - killed < 5
  assert "error: process 1 of 2 was lost (killed by SIGKILL)" in err


def test_the_trainers_die_with_a_launcher_killed_hard(data_dir, tmp_path):
  proc = _launch(tmp_path, _overrides(data_dir, num_train_steps=100000, checkpoint_every_steps=0), devices=1)
  try:
    runs.wait_for(lambda: (tmp_path / "metrics.jsonl").exists(), timeout=120, every=0.1)
    trainers = [_pid_of_rank(tmp_path, r) for r in range(2)]
    assert None not in trainers
    os.kill(proc.pid, signal.SIGKILL)  # The launcher only: its trainers are in sessions of their own.
    proc.communicate()
    killed = time.time()
    runs.wait_for(lambda: all(_pid_of_rank(tmp_path, r) is None for r in range(2)) or time.time() - killed > 10,
                  every=0.05)
    assert time.time() - killed < 5, "the trainers outlived their launcher"  # They ignore SIGTERM.
  finally:
    for pid in filter(None, [_pid_of_rank(tmp_path, r) for r in range(2)]):
      os.kill(pid, signal.SIGKILL)


def test_sigterm_to_one_process_stops_both_at_one_step_with_a_checkpoint(data_dir, tmp_path, one_by_eight):
  # The processes agree through JAX's preemption service (no per-step collective): both stop after the
  # same step, write one checkpoint there together, and exit 0; what they trained matches 1 x 8.
  proc = _launch(tmp_path, _overrides(data_dir, num_train_steps=100000, checkpoint_every_steps=0))
  runs.wait_for(lambda: (tmp_path / "metrics.jsonl").exists(), timeout=120, every=0.1)
  os.kill(_pid_of_rank(tmp_path, 1), signal.SIGTERM)
  out = _finish(proc, timeout=90)
  saved = [int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()]
  assert len(saved) == 1 and 0 < saved[0] < 100000, saved
  assert f"step {saved[0]}: stop requested" in out
  losses = runs.train_losses(tmp_path)
  assert max(losses) == saved[0]  # No process trained past the agreed step.
  common = {s: l for s, l in losses.items() if s <= 2 * K}
  _assert_losses_close(common, {s: l for s, l in runs.train_losses(one_by_eight[0]).items() if s in common})


def test_sigterm_to_the_launcher_stops_its_processes_with_a_checkpoint(data_dir, tmp_path):
  proc = _launch(tmp_path, _overrides(data_dir, num_train_steps=100000, checkpoint_every_steps=0), devices=1)
  runs.wait_for(lambda: (tmp_path / "metrics.jsonl").exists(), timeout=120, every=0.1)
  proc.send_signal(signal.SIGTERM)  # As a scheduler stops a job: like Ctrl-C, not like a kill.
  out = _finish(proc, timeout=90)
  saved = [int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()]
  assert len(saved) == 1 and f"step {saved[0]}: stop requested" in out, out[-2000:]


def test_a_hung_process_is_declared_lost_without_the_launcher(data_dir, tmp_path):
  port = launch.free_port()
  args = [*runs.flags(_overrides(data_dir, num_train_steps=100000, checkpoint_every_steps=0)), "--workdir",
          str(tmp_path)]
  env = {"JAXDP_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAXDP_NUM_PROCESSES": "2"}
  command = runs.train_with(HEARTBEAT_TIMEOUT_S=5)  # Not the 100 s of the constant.
  procs = [runs.start(command, args, devices=1, JAXDP_PROCESS_ID=str(r), **env) for r in range(2)]
  try:
    runs.wait_for(lambda: (tmp_path / "metrics.jsonl").exists(), timeout=120, every=0.1)
    procs[1].send_signal(signal.SIGSTOP)  # Alive but silent: no heartbeats.
    stopped = time.time()
    out, _ = procs[0].communicate(timeout=60)
    assert procs[0].returncode != 0 and time.time() - stopped < 5 + 25
    assert "tasks are unhealthy (stopped sending heartbeats):\n1\n" in out
  finally:
    procs[1].kill()
    procs[1].communicate()


def test_launcher_rejects_bad_counts(capsys):
  with pytest.raises(SystemExit) as exit_info:
    launch.parse(["--num_processes", "0", "--", "--config", "x.py"])
  assert exit_info.value.code == 2 and "--num_processes" in capsys.readouterr().err
