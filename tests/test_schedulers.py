"""Cluster schedulers: SLURM (one task per GPU, or one per node) and Kubernetes (the shipped JobSet) start processes
that join one run with every device they were given, and train as 1 x 8 does; a second run on a live workdir is
refused. The shipped files (deploy/) are what the real runs here execute, so they cannot go stale."""

import errno
import hashlib
import logging
import os
import pathlib
import random
import re
import shlex
import signal
import socket
import subprocess
import sys

import same_training
import jax
import pytest
import runs
import test_multiprocess as mp
import yaml
from jax._src import clusters

from jaxdp import checkpoint, parallel, train
from jaxdp.config import ConfigError
from jaxdp.configs import default
from jaxdp.loop import workdir_lock
from jaxdp.runtime import distributed
from jaxdp.tools import audit, launch

ROOT = pathlib.Path(__file__).resolve().parent.parent
SBATCH = ROOT / "deploy" / "slurm" / "train.sbatch"
JOBSET = ROOT / "deploy" / "kubernetes" / "jobset.yaml"
# What a scheduler or launcher tells a process: none of it may leak from the shell that runs the tests.
SCHEDULER_PREFIXES = ("SLURM_", "OMPI_", "JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                      "JAX_LOCAL_DEVICE_IDS", "JAXDP_COORDINATOR", "JAXDP_NUM_PROCESSES", "JAXDP_PROCESS_ID",
                      "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "KUBERNETES_",
                      "JOB_COMPLETION_INDEX", "TPU_WORKER_")
RUN_TIMEOUT_S = 300


def _overrides(data_dir, **more) -> dict:
  """test_multiprocess's run (blocks of steps, the audit), shorter: 10 steps, a checkpoint at 5."""
  return mp._overrides(data_dir, **{"num_train_steps": 10, "checkpoint_every_steps": 5, "eval_every_steps": 10,
                                    **more})


def _clean_env() -> dict[str, str]:
  """This process's environment without any scheduler's variables."""
  return {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULER_PREFIXES)}


# ---------------------------------------------------------------------------------------------- in-process joins


def _slurm(ntasks: int, per_node: int, procid: int, **more: str) -> dict[str, str]:
  """A task's SLURM variables as srun sets them (nodes gpu001, gpu002, ...; `per_node` tasks on each)."""
  nodes = ntasks // per_node
  return {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": str(ntasks), "SLURM_NNODES": str(nodes),
          "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_NODELIST": f"gpu[001-{nodes:03d}]",
          "SLURM_STEP_NODELIST": f"gpu[001-{nodes:03d}]", "SLURM_PROCID": str(procid),
          "SLURM_LOCALID": str(procid % per_node), "SLURM_NODEID": str(procid // per_node),
          "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_TASKS_PER_NODE": f"{per_node}(x{nodes})",
          "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{nodes})", **more}


EIGHT = ",".join(map(str, range(8)))
LAYOUTS = {  # name: (task's environment, the local_device_ids jaxdp passes)
    # --ntasks-per-node=8 --gpus-per-task=1: srun binds each task to its GPU.
    "one task per GPU": (_slurm(16, 8, 11, SLURM_GPUS_PER_TASK="1", CUDA_VISIBLE_DEVICES="3"), []),
    # --ntasks-per-node=1 --gpus-per-node=8: the task takes them all (JAX alone: [0], one GPU).
    "one task per node": (_slurm(2, 1, 1, SLURM_GPUS_ON_NODE="8", CUDA_VISIBLE_DEVICES=EIGHT), []),
    # --ntasks-per-node=2 --gpus-per-task=4: each task bound to its four.
    "two tasks of 4 GPUs, bound": (_slurm(4, 2, 3, SLURM_GPUS_PER_TASK="4", CUDA_VISIBLE_DEVICES="4,5,6,7"), []),
    # --ntasks-per-node=8 --gpus-per-node=8: every task sees the node's 8; each takes its own by local rank.
    "8 tasks sharing a node's GPUs": (_slurm(16, 8, 11, SLURM_GPUS_ON_NODE="8", CUDA_VISIBLE_DEVICES=EIGHT), [3]),
    "2 tasks sharing a node's GPUs": (_slurm(4, 2, 3, SLURM_GPUS_ON_NODE="8", CUDA_VISIBLE_DEVICES=EIGHT),
                                      [4, 5, 6, 7]),
    # No GPU variable (a CPU node; GPUs outside SLURM's gres): one each by local rank, as JAX does.
    "2 tasks, no GPU variable": (_slurm(4, 2, 3), [1]),
}


@pytest.fixture
def joined_with(monkeypatch):
  """Runs `distributed.initialize` in this process under an environment; returns what it passed to JAX."""
  def join(env: dict[str, str], init_timeout_s: int = distributed.INIT_TIMEOUT_S) -> dict:
    for name in list(os.environ):
      if name.startswith(SCHEDULER_PREFIXES):
        monkeypatch.delenv(name)
    for name, value in env.items():
      monkeypatch.setenv(name, value)
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(distributed, "_joined", False)
    monkeypatch.setattr(distributed, "_restricted_to", [], raising=False)
    monkeypatch.setattr(distributed, "INIT_TIMEOUT_S", init_timeout_s)
    assert distributed.initialize()
    [kwargs] = calls
    return kwargs
  return join


@pytest.mark.parametrize("layout", LAYOUTS)
def test_slurm_tasks_take_every_gpu_they_were_given(joined_with, layout):
  env, ids = LAYOUTS[layout]
  kwargs = joined_with(env, init_timeout_s=30)
  assert kwargs == {"local_device_ids": ids, "initialization_timeout": 30, "heartbeat_timeout_seconds": 100}
  # JAX's own detection fills in the rest and keeps these devices ([] is "all": no one-GPU default).
  found = clusters.ClusterEnv.auto_detect_unset_distributed_params(None, None, None, ids, None, 30)
  procid, ntasks = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
  assert found == (f"gpu001:{4242 % 4096 + 61440}", ntasks, procid, ids)


def test_the_summary_counts_the_gpus_a_process_could_see(joined_with, monkeypatch):
  joined_with(LAYOUTS["8 tasks sharing a node's GPUs"][0])  # Took [3] of the 8 it sees.
  assert distributed.devices_seen(1, "gpu") == 8
  assert distributed.devices_seen(4, "cpu") == 4  # local_device_ids leave CPU devices alone.
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
  assert distributed.devices_seen(1, "gpu") is None  # How many there were is unknown: "?".
  joined_with(LAYOUTS["one task per node"][0])  # Took all it sees.
  assert distributed.devices_seen(8, "gpu") == 8


def test_slurm_devices_that_do_not_divide_among_the_tasks_are_one_error(joined_with):
  with pytest.raises(ConfigError, match="3 processes on this node cannot share its 8 visible GPUs"):
    joined_with(_slurm(3, 3, 1, CUDA_VISIBLE_DEVICES=EIGHT))


def test_a_device_list_of_the_users_own_is_left_to_jax(joined_with):
  env, _ = LAYOUTS["one task per node"]
  assert "local_device_ids" not in joined_with({**env, "JAX_LOCAL_DEVICE_IDS": "0,1"})


def test_kubeflows_jax_variables_join_the_run(joined_with):
  kwargs = joined_with({"JAX_COORDINATOR_ADDRESS": "trainer-node-0-0.trainer:1234", "JAX_NUM_PROCESSES": "4",
                        "JAX_PROCESS_ID": "0"})
  assert kwargs == {"coordinator_address": "trainer-node-0-0.trainer:1234", "num_processes": 4, "process_id": 0,
                    "initialization_timeout": 300, "heartbeat_timeout_seconds": 100}


def test_a_bad_process_count_in_the_environment_is_named(joined_with):
  with pytest.raises(ConfigError, match=r"process count and id must be integers, got 'four' and '0' "
                                        r"\(from JAX_NUM_PROCESSES and JAX_PROCESS_ID\)"):
    joined_with({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "four", "JAX_PROCESS_ID": "0"})


def test_an_indexed_kubernetes_job_joins_through_jaxs_detection(joined_with, monkeypatch):
  # JAX asks the Kubernetes API for the rest while joining; here the API is never reached.
  monkeypatch.setattr(clusters.K8sCluster, "is_env_present", classmethod(lambda cls: True))
  assert joined_with({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "JOB_COMPLETION_INDEX": "1"}) == {
      "initialization_timeout": 300, "heartbeat_timeout_seconds": 100}
  monkeypatch.delenv("JOB_COMPLETION_INDEX")  # Any other pod (a notebook, a Deployment) trains alone.
  assert not distributed._cluster_detected()


# ------------------------------------------------------------------------------------------- real runs, 2 x 4


def _start(commands: list[list[str]], envs: list[dict[str, str]]) -> list[subprocess.Popen]:
  return [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True) for cmd, env in zip(commands, envs)]


def _finish_all(procs: list[subprocess.Popen]) -> list[str]:
  """Each process's stdout, once all exited 0; none outlives the test, whatever happens."""
  outs = []
  try:
    for proc in procs:
      out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
      assert proc.returncode == 0, out[-3000:] + err[-3000:]
      outs.append(out)
  finally:
    for proc in procs:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
  return outs


def _assert_like_one_by_eight(data_dir, workdir, reference) -> None:
  """Losses, evals, final parameters and every global batch as 1 x 8's; the audit passes on the workdir."""
  ref_dir, ref_params = reference
  mp._assert_losses_close(runs.train_losses(workdir), runs.train_losses(ref_dir))
  evals, ref_evals = mp._evals(workdir), mp._evals(ref_dir)
  assert evals.keys() == ref_evals.keys() and evals
  for step, scalars in ref_evals.items():
    assert evals[step] == pytest.approx(scalars, rel=1e-4), step
  config = runs.config_with(_overrides(data_dir))
  backend = parallel.make_backend("mesh")
  state = checkpoint.Checkpointer(str(workdir), config).restore_or_init(backend, mp._init_for(config))
  # gloo's sums across processes round in another order.
  same_training.assert_same_training(backend.get(state.params), ref_params)
  assert audit.main(["audit", str(workdir)]) == 0  # Every example once per epoch.
  assert audit.main(["audit", str(ref_dir), str(workdir)]) == 0  # The same global batches, step by step.


@pytest.fixture(scope="module")
def one_by_eight(data_dir, tmp_path_factory):
  """The reference: 1 process x 8 devices, in this process."""
  workdir = tmp_path_factory.mktemp("one_by_eight")
  result = train.train_and_evaluate(runs.config_with(_overrides(data_dir)), str(workdir))
  return workdir, result.backend.get(result.state.params)


def _free_slurm_port() -> int:
  """A free port in the range JAX's SLURM detection takes its coordinator's from (SLURM_JOB_ID % 4096)."""
  for port in random.sample(range(61440, 65536), 200):
    with socket.socket() as s:
      try:
        s.bind(("", port))
      except OSError:
        continue
      return port
  raise AssertionError("no free port in 61440-65535")


def _srun_command(workdir, overrides: dict) -> list[str]:
  """The sbatch script's srun line, as the task runs it: srun's options off, CONFIG WORKDIR ARGS filled in."""
  [line] = [ln for ln in SBATCH.read_text().splitlines() if ln.startswith("srun ")]
  words = shlex.split(line)[1:]
  words = words[next(i for i, w in enumerate(words) if not w.startswith("-")):]  # srun's own options.
  fill = {"$CONFIG": [default.__file__], "$WORKDIR": [str(workdir)],
          "$@": [f"--config.{k}={v}" for k, v in overrides.items()]}
  assert words[0] == "python" and set(fill) <= set(words), words
  return [sys.executable] + [part for w in words[1:] for part in fill.get(w, [w])]


def test_the_sbatch_script_trains_two_tasks_as_one_by_eight(data_dir, tmp_path, one_by_eight):
  # Two tasks on one node (localhost), no launcher: each joins through SLURM's variables alone.
  directives = [ln.split()[1] for ln in SBATCH.read_text().splitlines() if ln.startswith("#SBATCH")]
  assert "--gpus-per-task=1" in directives and any(d.startswith("--ntasks-per-node=") for d in directives)
  port = _free_slurm_port()
  env = {**_slurm(2, 2, 0), "SLURM_JOB_ID": str(port - 61440 + 3 * 4096), "SLURM_NODELIST": "localhost",
         "SLURM_STEP_NODELIST": "localhost", "SLURM_GPUS_PER_TASK": "1"}
  command = _srun_command(tmp_path, _overrides(data_dir))
  envs = [{**_clean_env(), **env, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r), "JAXDP_CPU_DEVICES": "4"}
          for r in range(2)]
  out0, out1 = _finish_all(_start([command, command], envs))
  readme = " ".join((ROOT / "README.md").read_text().split())  # Its example of the summary's line, unwrapped.
  assert re.search(r"`(2 processes of 4 devices; this one has [^`]*)`", readme).group(1) in out0
  assert "step 10" in out0 and "step" not in out1  # Only process 0 reports.
  _assert_like_one_by_eight(data_dir, tmp_path, one_by_eight)


def _pods() -> tuple[list[str], list[dict], dict]:
  """The JobSet's container command, its env entries, and its Job spec."""
  doc = yaml.safe_load(JOBSET.read_text())
  [replicated] = doc["spec"]["replicatedJobs"]
  job = replicated["template"]["spec"]
  [container] = job["template"]["spec"]["containers"]
  # The coordinator is pod 0 of job 0, by the name JobSet gives it (JOBSET-JOB-0-0.JOBSET).
  name, rjob = doc["metadata"]["name"], replicated["name"]
  [address] = [e["value"] for e in container["env"] if e["name"] == "JAX_COORDINATOR_ADDRESS"]
  assert address.rpartition(":")[0] == f"{name}-{rjob}-0-0.{name}"
  return container["command"] + container["args"], container["env"], job


def _pod_env(entries: list[dict], index: int, address: str) -> dict[str, str]:
  """The variables Kubernetes gives pod `index` from the manifest's entries; the coordinator at `address`."""
  env = {"JOB_COMPLETION_INDEX": str(index)}  # An indexed Job's own variable.
  for entry in entries:
    if "value" in entry:
      env[entry["name"]] = entry["value"]
    else:  # The downward API: the pod's completion index.
      assert entry["valueFrom"]["fieldRef"]["fieldPath"] == (
          "metadata.annotations['batch.kubernetes.io/job-completion-index']"), entry
      env[entry["name"]] = str(index)
  env["JAX_COORDINATOR_ADDRESS"] = address  # The pod's DNS name and port, here on 127.0.0.1.
  return env


def test_the_jobset_trains_its_pods_as_one_by_eight(data_dir, tmp_path, one_by_eight):
  command, entries, job = _pods()
  count = int(next(e["value"] for e in entries if e["name"] == "JAX_NUM_PROCESSES"))
  assert job["parallelism"] == job["completions"] == count == 2 and job["completionMode"] == "Indexed"
  assert command[:3] == ["python", "-m", "jaxdp.train"]
  flag = {w: command[i + 1] for i, w in enumerate(command) if w in ("--config", "--workdir")}
  assert set(flag) == {"--config", "--workdir"}
  fill = {flag["--config"]: default.__file__, flag["--workdir"]: str(tmp_path)}
  argv = [sys.executable] + [fill.get(w, w) for w in command[1:]] + [
      f"--config.{k}={v}" for k, v in _overrides(data_dir).items()]
  address = f"127.0.0.1:{launch.free_port()}"
  envs = [{**_clean_env(), **_pod_env(entries, i, address), "JAXDP_CPU_DEVICES": "4"} for i in range(count)]
  out0, _ = _finish_all(_start([argv] * count, envs))
  assert "2 processes of 4 devices" in out0
  _assert_like_one_by_eight(data_dir, tmp_path, one_by_eight)


# ------------------------------------------------------------------------------------------------ one run per dir


def _snapshot(workdir) -> dict[str, tuple[int, int, str]]:
  """Every file under `workdir`: (size, mtime in ns, sha256)."""
  found = {}
  for root, _, files in os.walk(workdir):
    for name in files:
      path = os.path.join(root, name)
      found[os.path.relpath(path, workdir)] = (os.path.getsize(path), os.stat(path).st_mtime_ns,
                                               hashlib.sha256(open(path, "rb").read()).hexdigest())
  return found


def test_a_second_run_on_a_live_workdir_is_refused_and_a_killed_one_resumes(data_dir, tmp_path):
  workdir = tmp_path / "run"

  def args(steps: int) -> list[str]:
    overrides = _overrides(data_dir, num_train_steps=steps, eval_every_steps=steps, audit_data=False)
    return [sys.executable, "-m", "jaxdp.train", *runs.flags(overrides), "--workdir", str(workdir)]

  env = {**_clean_env(), "JAXDP_CPU_DEVICES": "1"}
  with open(tmp_path / "first.log", "w") as log:
    first = subprocess.Popen(args(100000), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
  try:
    runs.wait_for(lambda: 10 in checkpoint.steps(str(workdir)) or first.poll() is not None, timeout=180, every=0.1)
    assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    first.send_signal(signal.SIGSTOP)  # Holds still: anything that changes now is the second run's doing.
    before = _snapshot(workdir)
    second = subprocess.run(args(20), env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    err = second.stderr.strip()
    assert second.returncode == 2 and len(err.splitlines()) == 1, err[-3000:]
    assert err.startswith(f"error: workdir {str(workdir)!r} is in use by a live run (process 0 on host "
                          f"{socket.gethostname()}, pid {first.pid})"), err
    assert _snapshot(workdir) == before
    assert any(name.startswith("checkpoints/") for name in before) and "metrics.jsonl" in before
    # A run of two processes: process 0 is refused, and process 1, told so, writes nothing either.
    launched = subprocess.run([sys.executable, "-m", "jaxdp.launch", "--num_processes", "2", "--devices_per_process",
                               "1", "--", *args(20)[3:], "--config.audit_data=True"], env=env, capture_output=True,
                              text=True, timeout=RUN_TIMEOUT_S)
    output = launched.stdout + launched.stderr
    assert launched.returncode == 2 and f"workdir {str(workdir)!r} is in use by a live run" in output, output[-3000:]
    assert _snapshot(workdir) == before
  finally:
    os.killpg(first.pid, signal.SIGKILL)  # As a node dies: the lock's file stays, its lock goes with the process.
    first.wait()
  last = max(checkpoint.steps(str(workdir)))
  resumed = subprocess.run(args(last + 2), env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"resumed from step {last} ({workdir}/checkpoints/{last})" in resumed.stdout, resumed.stdout[-3000:]


def test_a_workdir_without_locks_is_trained_with_a_warning(tmp_path, monkeypatch, caplog):
  def no_locks(fd: int, operation: int) -> None:
    raise OSError(errno.ENOLCK, "No locks available")
  monkeypatch.setattr(workdir_lock.fcntl, "flock", no_locks)
  with caplog.at_level(logging.WARNING, logger="jaxdp"), workdir_lock.hold(str(tmp_path)):
    pass
  assert "not taken (No locks available): a second run there would not be refused" in caplog.text


@pytest.mark.parametrize("per_node, node, procid, local, ids", [
    ("2,1", 1, 2, 0, []),                           # The lone task of the second node: all 8 of its GPUs.
    ("2,1", 0, 1, 1, [4, 5, 6, 7]),                 # Two on the first node: half each.
    ("2(x3),1", 3, 6, 0, []),                       # SLURM's compressed form: the fourth node's one task.
    ("2(x3),1", 2, 5, 1, [4, 5, 6, 7])])
def test_slurm_uneven_nodes_give_each_task_its_node_s_share(joined_with, per_node, node, procid, local, ids):
  """`sbatch -n 3` over two nodes: SLURM_TASKS_PER_NODE="2,1"; a node's share is by its own task count."""
  nodes = len(per_node.split(",")) if "(x" not in per_node else 4
  env = {**_slurm(int(procid) + 1, 2, procid, SLURM_GPUS_ON_NODE="8", CUDA_VISIBLE_DEVICES=EIGHT),
         "SLURM_NTASKS": str(2 * nodes - 1), "SLURM_TASKS_PER_NODE": per_node, "SLURM_STEP_TASKS_PER_NODE": per_node,
         "SLURM_NODEID": str(node), "SLURM_LOCALID": str(local), "SLURM_NNODES": str(nodes),
         "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_NODELIST": f"gpu[001-{nodes:03d}]",
         "SLURM_STEP_NODELIST": f"gpu[001-{nodes:03d}]"}
  assert joined_with(env)["local_device_ids"] == ids
