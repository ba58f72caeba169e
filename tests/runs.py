"""One set of overrides -> the same run in-process (a config) or as a CLI process (flags)."""

import functools
import glob
import os
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np

from jaxdp import models, step as step_lib
from jaxdp.batch import REAL
from jaxdp.report import metrics
from jaxdp.configs import default


def config_with(overrides: dict, base=default):
  """`base.get_config()` with dotted-key overrides applied."""
  return override(base.get_config(), overrides)


def override(config, overrides: dict):
  """Sets each dotted key ("parallel.backend") of `overrides` in `config`; returns `config`."""
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    target = config
    for p in parents:
      target = target[p]
    target[leaf] = value
  return config


def flags(overrides: dict, base=default) -> list[str]:
  """The same overrides as jaxdp.train command-line flags."""
  return ["--config", base.__file__, *[f"--config.{k}={v}" for k, v in overrides.items()]]


def start(module: str | list[str], args: list[str], devices: int = 8, **env) -> subprocess.Popen:
  """`python -m module args` (or `python *module args`) with `devices` CPU devices, output captured as text."""
  full_env = {**os.environ, "JAXDP_CPU_DEVICES": str(devices), **env}
  command = ["-m", module] if isinstance(module, str) else module
  return subprocess.Popen([sys.executable, *command, *args], env=full_env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def train_with(**constants) -> list[str]:
  """`python -c` arguments that run jaxdp.train with these constants of `jaxdp.runtime.distributed` set (a test's
  short timeouts), then the command line's arguments."""
  settings = "; ".join(f"distributed.{name} = {value!r}" for name, value in constants.items())
  return ["-c", f"import sys; from jaxdp.runtime import distributed; {settings}; from jaxdp import train; "
                "sys.exit(train.main(sys.argv))"]


def wait_for(predicate, timeout: float = 120.0, every: float = 0.005) -> None:
  deadline = time.time() + timeout
  while not predicate():
    assert time.time() < deadline, "timed out"
    time.sleep(every)


def prefetch_threads() -> set[threading.Thread]:
  """The input prefetch threads alive now (`jaxdp.parallel.Prefetcher`'s)."""
  return {t for t in threading.enumerate() if t.name == "jaxdp-prefetch"}


def trainer_pids(workdir) -> dict[int, int]:
  """rank (JAXDP_PROCESS_ID) -> pid of the jaxdp.train processes running in `workdir`."""
  found = {}
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      cmdline = open(f"/proc/{pid}/cmdline").read()
      environ = open(f"/proc/{pid}/environ").read().split("\0")
    except OSError:
      continue
    if "jaxdp.train" in cmdline and str(workdir) in cmdline:
      rank = next((int(v.split("=")[1]) for v in environ if v.startswith("JAXDP_PROCESS_ID=")), None)
      found[rank] = int(pid)
  return found


def train_losses(workdir, after: int = 0) -> dict[int, float]:
  """step -> train/loss logged in a workdir, for steps after `after`."""
  return {r["step"]: r["train/loss"] for r in metrics.read(str(workdir)) if "train/loss" in r and r["step"] > after}


def host_state(result) -> dict:
  """Parameters and optimizer state of a finished run, on the host."""
  return result.backend.get({"params": result.state.params, "opt_state": result.state.opt_state})


def assert_bitwise(a, b) -> None:
  jax.tree.map(np.testing.assert_array_equal, a, b)


def eval_sums(task, outputs, labels, real) -> dict:
  """`task`'s eval sums over one batch on 2 replicas (leaves [2, rows, ...]), the model's outputs being `outputs`
  (an identity model); replica 0's host copy, which every replica's equals."""
  model = models.adapter.Model(init=None, apply=lambda p, s, x, **kw: (x, s))
  state = step_lib.TrainState(step=0, params={}, model_state={}, opt_state=(), rng=jax.random.PRNGKey(0))
  eval_step = functools.partial(step_lib.eval_step, model=model, axis=step_lib.DataAxis("data"), task=task)
  sums = jax.jit(jax.vmap(lambda b: eval_step(state, b), axis_name="data"))({"inputs": outputs, "labels": labels,
                                                                              REAL: real})
  return jax.tree.map(lambda x: np.asarray(x[0]), sums)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
  """The output of `proc` (started with start_new_session=True), asserting it exited 0; its group killed on a timeout."""
  try:
    out, _ = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)  # The script (or the launcher and its processes): none outlives the test.
    raise
  assert proc.returncode == 0, out[-4000:]
  return out


def final(workdir) -> dict[str, np.ndarray]:
  """WORKDIR/final.npz, as a user script under test saves its final state."""
  with np.load(os.path.join(workdir, "final.npz")) as f:
    return dict(f)


def read_tensorboard(workdir: str) -> dict[str, list[tuple[int, float]]]:
  """Every scalar in a workdir's TensorBoard event files: tag -> [(step, value), ...] in file order."""
  from tensorboard.backend.event_processing import event_file_loader
  scalars: dict[str, list[tuple[int, float]]] = {}
  for path in sorted(glob.glob(os.path.join(workdir, "events.out.tfevents.*"))):
    for event in event_file_loader.EventFileLoader(path).Load():
      for value in event.summary.value:
        number = value.tensor.float_val[0] if value.HasField("tensor") else value.simple_value
        scalars.setdefault(value.tag, []).append((int(event.step), float(number)))
  return scalars
