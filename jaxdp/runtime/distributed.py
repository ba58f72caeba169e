"""Joining a multi-process run through `jax.distributed`, explicitly or by cluster auto-detection."""

import ctypes
import os
import signal
import socket
import sys
import time

import jax
import ml_collections

from jaxdp.config import ConfigError

# Environment variables the local launcher (and any scheduler script) may set instead of the config.
ENV_COORDINATOR = "JAXDP_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAXDP_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXDP_PROCESS_ID"
# Set by the launcher: Python's prints go to stderr, so native code's stdout (gloo's lines) stays apart.
ENV_PRINT_TO_STDERR = "JAXDP_PRINT_TO_STDERR"
# Set by the launcher: its pid, so that this process dies with it (die_with_launcher).
ENV_LAUNCHER_PID = "JAXDP_LAUNCHER_PID"
# Set by the launcher: a file this process creates once it has joined the run (all processes connected).
# A rank that fails again without creating it cannot be restarted (jaxdp.launch --min_processes).
ENV_JOINED_FILE = "JAXDP_JOINED_FILE"
_PR_SET_PDEATHSIG = 1  # From <linux/prctl.h>.
_joined = False  # This process joined its run (`initialize`): a second call (the CLI, then the loop) is a no-op.

# Markers of clusters where `jax.distributed.initialize()` finds every argument by itself.
_CLUSTER_SIZE_VARS = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def _cluster_detected() -> bool:
  """Whether this process is one of several under SLURM, Open MPI or a multi-host Cloud TPU slice."""
  if any(int(os.environ.get(v, "1") or 1) > 1 for v in _CLUSTER_SIZE_VARS):
    return True
  return "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")


class DistributedInitError(RuntimeError):
  """The processes of a multi-process run could not find each other in time."""


def wait_for_coordinator(address: str, timeout_s: float) -> None:
  """Returns once the coordinator accepts TCP connections; a ConfigError after `timeout_s` seconds.

  jax.distributed.initialize itself aborts the process (SIGABRT, a C++ trace) when the coordinator stays
  unreachable; probing first turns a wrong address or a coordinator that never started into one line.
  """
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    raise ConfigError(f"distributed.coordinator_address must be host:port, got {address!r}")
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      with socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.1, min(5.0, timeout_s))):
        return
    except OSError as e:
      if time.monotonic() >= deadline:
        raise ConfigError(f"coordinator {address} unreachable after distributed.init_timeout_s={timeout_s} s "
                          f"({e.strerror or e}); start process 0 first, or check the address and port") from None
      time.sleep(0.25)  # The coordinator may simply not be up yet.


def die_with_launcher() -> None:
  """Under jaxdp.launch (Linux), has the kernel SIGKILL this process when the launcher dies.

  A SIGTERM from the launcher is not enough: jax.distributed's preemption service installs a C-level SIGTERM
  handler, so a trainer whose launcher was killed hard lived on for minutes. The variable is removed from the
  environment, so that no process this one starts takes the launcher for its parent.
  """
  launcher = os.environ.pop(ENV_LAUNCHER_PID, "")
  if not launcher.isdigit() or not sys.platform.startswith("linux"):
    return
  ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  if os.getppid() != int(launcher):  # The launcher died before prctl: no signal will come.
    os.kill(os.getpid(), signal.SIGKILL)


def _report_joined() -> None:
  """Creates the launcher's ENV_JOINED_FILE (when set): this process reached every other one."""
  path = os.environ.pop(ENV_JOINED_FILE, "")
  if path:
    with open(path, "w"):
      pass


def settings(config: ml_collections.ConfigDict) -> dict:
  """Coordinator address, process count and id from `config.distributed`, else the environment."""
  c = config.distributed
  address = c.coordinator_address or os.environ.get(ENV_COORDINATOR)
  num = c.num_processes or int(os.environ.get(ENV_NUM_PROCESSES, 0))
  pid = c.process_id
  pid = pid if pid >= 0 else int(os.environ.get(ENV_PROCESS_ID, -1))
  if address and (num < 1 or not 0 <= pid < num):
    raise ConfigError(f"distributed: coordinator {address!r} needs num_processes >= 1 and 0 <= process_id < "
                      f"num_processes, got num_processes={num!r}, process_id={pid!r}")
  return {"coordinator_address": address, "num_processes": num, "process_id": pid}


def initialize(config: ml_collections.ConfigDict) -> bool:
  """Joins the run when it is multi-process (explicit, or a detected cluster); returns whether it did.

  Must run before any JAX computation. Fails after `distributed.init_timeout_s` instead of waiting forever.
  Called again in a process that already joined (the CLI joins, then `train_and_evaluate` asks), it returns True.
  """
  global _joined
  if _joined:
    return True
  die_with_launcher()
  c = config.distributed
  explicit = settings(config)
  auto = c.auto_detect and _cluster_detected()
  if not explicit["coordinator_address"] and not auto:
    return False
  kwargs = {k: v for k, v in explicit.items() if explicit["coordinator_address"]}
  timeout = c.init_timeout_s
  if explicit["coordinator_address"] and explicit["process_id"] != 0:
    wait_for_coordinator(explicit["coordinator_address"], timeout)
  try:
    jax.distributed.initialize(**kwargs, initialization_timeout=timeout,
                               heartbeat_timeout_seconds=c.heartbeat_timeout_s)
  except Exception as e:  # JAX raises several types (XlaRuntimeError, ValueError, ...) for the same failure.
    where = explicit["coordinator_address"] or "the auto-detected cluster"
    raise DistributedInitError(f"could not join the distributed run at {where} as process "
                               f"{explicit['process_id']} of {explicit['num_processes']} within {timeout} s: "
                               f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
  _joined = True
  _report_joined()
  return True


def joined() -> bool:
  """Whether this process already joined its run (`initialize` returned True)."""
  return _joined


def launched() -> bool:
  """Whether this process was started to join a run (jaxdp.launch or a scheduler script set JAXDP_*)."""
  return bool(os.environ.get(ENV_COORDINATOR))
