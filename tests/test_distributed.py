"""Joining a multi-process run: which settings and clusters join one, and setup mistakes end in exactly one `error:`
line on stderr and exit status 2, not a traceback or an abort."""

import os
import socket
import subprocess
import sys
import time

import jax
import pytest
import runs

from jaxdp import config as config_lib
from jaxdp import train
from jaxdp.configs import mlp_digits
from jaxdp.runtime import distributed, process


def _unused_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _flags(tmp_path, data_dir, *overrides) -> list[str]:
  return ["--config", mlp_digits.__file__, "--workdir", str(tmp_path), f"--config.dataset.data_dir={data_dir}",
          "--config.num_train_steps=2", *overrides]


def test_an_unreachable_coordinator_is_one_line_and_exit_2(tmp_path, data_dir):
  port = _unused_port()
  env = {**os.environ, "JAXDP_CPU_DEVICES": "1", distributed.ENV_COORDINATOR: f"127.0.0.1:{port}",
         distributed.ENV_NUM_PROCESSES: "2", distributed.ENV_PROCESS_ID: "1"}
  started = time.time()
  # jaxdp.train with a 2 s join timeout (the constant is 300 s): the error must not wait for it.
  proc = subprocess.run([sys.executable, *runs.train_with(INIT_TIMEOUT_S=2), *_flags(tmp_path, data_dir)],
                        env=env, capture_output=True, text=True, timeout=120)
  err = proc.stderr.strip()
  assert proc.returncode == 2, (proc.stdout, err)
  assert len(err.splitlines()) == 1 and err.startswith("error: coordinator 127.0.0.1:") and str(port) in err, err
  assert "unreachable after 2 s" in err and time.time() - started < 60


@pytest.mark.parametrize("override, named", [("--config.best_mode=minimum", "'minimum'"),
                                             ("--config.best_metric=train/loss", "'train/loss'")])
def test_a_bad_best_mode_or_best_metric_is_one_line_and_exit_2(tmp_path, data_dir, capsys, override, named):
  status = train.main(["jaxdp.train", *_flags(tmp_path, data_dir, "--config.keep_best_checkpoints=1", override)])
  err = capsys.readouterr().err.strip()
  assert status == 2 and len(err.splitlines()) == 1 and err.startswith("error: best_") and named in err, err
  assert not (tmp_path / "metrics.jsonl").exists()


_SLURM_TASK = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}
_OMPI = {"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.0.0.1:34911"}


@pytest.mark.parametrize("env, detected", [
    ({}, False), ({**_SLURM_TASK, "SLURM_NTASKS": "1"}, False), ({**_SLURM_TASK, "SLURM_NTASKS": "2"}, True),
    ({"SLURM_NTASKS": "2"}, False), ({**_OMPI, "OMPI_COMM_WORLD_SIZE": "4"}, True),
    ({"OMPI_COMM_WORLD_SIZE": "4"}, False)])
def test_a_cluster_is_detected_only_with_more_than_one_process(monkeypatch, env, detected):
  """JAX's own detection decides (a shell of `salloc -n 2` is no task of a run); a one-task SLURM job trains alone:
  joining would wait for a coordinator that never comes."""
  for name in list(os.environ):
    if name.startswith(("SLURM_", "OMPI_", "TPU_", "KUBERNETES_", "JOB_COMPLETION_INDEX")):
      monkeypatch.delenv(name)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  assert distributed._cluster_detected() == detected


def _environment(monkeypatch, names: tuple[str, str, str], values: tuple[str, str, str]) -> None:
  for name in (*distributed.JAX_ENV, distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES,
               distributed.ENV_PROCESS_ID):
    monkeypatch.delenv(name, raising=False)
  for name, value in zip(names, values):
    monkeypatch.setenv(name, value)


def test_jaxdps_variables_win_over_jaxs(monkeypatch):
  _environment(monkeypatch, distributed.JAX_ENV, ("elsewhere:1", "4", "3"))
  assert distributed.settings() == {"coordinator_address": "elsewhere:1", "num_processes": 4, "process_id": 3}
  monkeypatch.setenv(distributed.ENV_COORDINATOR, "here:2")
  monkeypatch.setenv(distributed.ENV_NUM_PROCESSES, "2")
  monkeypatch.setenv(distributed.ENV_PROCESS_ID, "0")
  assert distributed.settings() == {"coordinator_address": "here:2", "num_processes": 2, "process_id": 0}


@pytest.mark.parametrize("num, pid", [(2, 2), (2, -1), (0, 0)])
def test_a_process_id_outside_the_run_is_named(monkeypatch, num, pid):
  names = (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES, distributed.ENV_PROCESS_ID)
  _environment(monkeypatch, names, ("here:2", str(num), str(pid)))
  with pytest.raises(config_lib.ConfigError, match=f"num_processes={num}, process_id={pid}"):
    distributed.settings()


@pytest.mark.parametrize("names", [distributed.JAX_ENV,
                                   (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES,
                                    distributed.ENV_PROCESS_ID)])
@pytest.mark.parametrize("values, missing", [(("here:2", "2", ""), 2), (("here:2", "", "1"), 1),
                                             (("here:2", "", ""), None)])
def test_a_missing_process_count_or_id_is_named(monkeypatch, names, values, missing):
  """JAX_NUM_PROCESSES without JAX_PROCESS_ID: one error naming the unset variable, not every process as id 0."""
  _environment(monkeypatch, names, values)
  for name, value in zip(names, values):
    if not value:
      monkeypatch.delenv(name, raising=False)
  unset = [names[1], names[2]] if missing is None else [names[missing]]
  with pytest.raises(config_lib.ConfigError, match=f"{names[0]}='here:2' is set but {' and '.join(unset)} not"):
    distributed.settings()


# A user's script: joins the run the launcher names, then one all-reduce across both processes.
_PSUM = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jaxdp
from jaxdp.loop import goodput
jaxdp.DataParallel()
mesh = Mesh(np.array(jax.devices()), ("data",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), np.ones(jax.local_device_count(), "f4"))
with goodput.CompileWatch() as watch:  # What the start summary's compile line says of the cache.
  total = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "data"), mesh=mesh, in_specs=P("data"), out_specs=P()))(x)
print("psum", float(total.addressable_data(0)[0]), watch.describe(), flush=True)
"""


def test_two_cpu_processes_run_again_on_the_cache_of_their_first_run(tmp_path):
  """A warm cache would have process 0 load what the others compile (each process's key is its own): on jax 0.12
  the second run hung in its all-reduce. A CPU run of several processes keeps no persistent cache."""
  script, cache = tmp_path / "psum.py", tmp_path / "cache"
  script.write_text(_PSUM)
  env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache)}
  for _ in range(2):
    out = subprocess.run([sys.executable, "-m", "jaxdp.launch", "--num_processes", "2", "--devices_per_process", "2",
                          "--", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.count("psum 4.0") == 2, (out.stdout + out.stderr)[-3000:]
    assert out.stdout.count("(no persistent cache)") == 2, out.stdout
  assert not cache.exists() or not os.listdir(cache)


def test_one_process_keeps_the_compilation_cache():
  assert jax.process_count() == 1 and jax.config.jax_enable_compilation_cache
  assert not process.no_cache_across_cpu_processes() and jax.config.jax_enable_compilation_cache
