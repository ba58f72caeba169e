"""Joining a multi-process run through `jax.distributed`: from jaxdp's variables, JAX's, or JAX's cluster detection."""

import ctypes
import os
import signal
import socket
import sys
import time

import jax

from jaxdp.config import ConfigError

# The run a process joins, as jaxdp.launch (or a scheduler script) sets it.
ENV_COORDINATOR = "JAXDP_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAXDP_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXDP_PROCESS_ID"
ENV_PRINT_TO_STDERR = "JAXDP_PRINT_TO_STDERR"  # Python's prints to stderr, apart from gloo's native stdout lines.
ENV_LAUNCHER_PID = "JAXDP_LAUNCHER_PID"  # This process dies with that pid (die_with_launcher).
# Created once joined: a rank that fails again without it cannot be restarted (jaxdp.launch --min_processes).
ENV_JOINED_FILE = "JAXDP_JOINED_FILE"
_PR_SET_PDEATHSIG = 1  # From <linux/prctl.h>.
INIT_TIMEOUT_S = 300  # Give up joining after this long, with an error naming the coordinator.
HEARTBEAT_TIMEOUT_S = 100  # A process silent this long is declared lost, and the others exit.
_joined = False  # A second `initialize` (the CLI's, then the loop's) is a no-op.

# JAX's names for the same three facts (Kubeflow Trainer's JAX runtime sets them; JAX reads only the address).
JAX_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
ENV_LOCAL_DEVICE_IDS = "JAX_LOCAL_DEVICE_IDS"  # The user's: JAX reads it, and `local_device_ids` steps aside.
_VISIBLE_DEVICES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
_restricted_to: list[int] = []  # The local_device_ids passed to JAX when this process took a share of what it sees.


def _cluster() -> type | None:
  """The cluster JAX's own detection finds, as `jax.distributed.initialize()` would, without reaching the network."""
  from jax._src import clusters  # JAX's registry of cluster kinds, in the order its own detection tries them.
  for env in clusters.ClusterEnv._cluster_types:
    # Every pod has KUBERNETES_SERVICE_HOST; only an indexed Job is a run, and JAX asks the API for the rest.
    if env.opt_in_only_method or (env is clusters.K8sCluster and "JOB_COMPLETION_INDEX" not in os.environ):
      continue
    if env.is_env_present():
      return env
  return None


def _cluster_detected() -> bool:
  """Whether JAX's cluster detection finds this process to be one of several (SLURM, Open MPI, Cloud TPU, K8s)."""
  from jax._src import clusters
  cluster = _cluster()  # An indexed Kubernetes Job's size is the API's: several, as it is a run.
  return cluster is not None and (cluster is clusters.K8sCluster or cluster.get_process_count() > 1)


def _visible_devices() -> int | None:
  """How many GPUs this process sees as the scheduler bound them; None where no variable says."""
  for name in _VISIBLE_DEVICES:
    if (value := os.environ.get(name)) is not None:
      return len([d for d in value.split(",") if d.strip()])
  return None


def _slurm_node() -> tuple[int, int | None]:
  """(tasks of this step on this node, GPUs per task or None) from SLURM's variables."""
  counts = []  # SLURM's compressed list: "8(x2),4" is 8, 8, 4.
  for part in (os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE", "1")).split(","):
    count, _, times = part.partition("(x")
    counts += [int(count)] * int(times.rstrip(")") or 1)
  node = min(int(os.environ.get("SLURM_NODEID", "0")), len(counts) - 1)
  per_task = os.environ.get("SLURM_GPUS_PER_TASK", "").rpartition(":")[2]  # "1" or "a100:1".
  return counts[node], int(per_task) if per_task.isdigit() else None


def local_device_ids(cluster: type) -> list[int] | None:
  """The GPUs this process takes (`local_device_ids`): [] for all it sees, its local rank's share of GPUs the node's
  processes all see, or None (JAX's one per process) where the user set JAX_LOCAL_DEVICE_IDS or no local ranks exist."""
  if os.environ.get(ENV_LOCAL_DEVICE_IDS) or getattr(cluster, "name", "") not in ("slurm", "ompi"):
    return None  # Only SLURM and Open MPI start several processes per node.
  if cluster.name == "slurm":
    here, per_task = _slurm_node()
  else:  # Open MPI: the processes on this node.
    here, per_task = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1")), None
  visible, rank = _visible_devices(), cluster.get_local_process_id()
  if here <= 1 or visible == 0:
    return []
  if visible is None:  # How many the node has is unknown: one each, as JAX does.
    return [rank]
  if visible < here or visible == per_task:  # The scheduler gave each process its own.
    return []
  if visible % here:
    raise ConfigError(f"{here} processes on this node cannot share its {visible} visible GPUs evenly "
                      f"({_VISIBLE_DEVICES[0]} and the like); give each task its own (--gpus-per-task) "
                      f"or set {ENV_LOCAL_DEVICE_IDS}")
  share = visible // here
  return list(range(rank * share, (rank + 1) * share))


def devices_seen(taken: int, platform: str) -> int | None:
  """How many devices this process could see, having taken `taken`; None where no variable says."""
  if not _restricted_to or platform == "cpu":  # It took all it sees (local_device_ids restrict GPUs only).
    return taken
  return _visible_devices()


class DistributedInitError(RuntimeError):
  """The processes of a multi-process run could not find each other in time."""


def wait_for_coordinator(address: str, timeout_s: float) -> None:
  """Returns once the coordinator accepts TCP connections; a ConfigError after `timeout_s` seconds."""
  # Else jax.distributed.initialize aborts the process (SIGABRT, a C++ trace) on an unreachable coordinator.
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    raise ConfigError(f"the coordinator address must be host:port, got {address!r} ({ENV_COORDINATOR} or "
                      f"{JAX_ENV[0]})")
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      with socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.1, min(5.0, timeout_s))):
        return
    except OSError as e:
      if time.monotonic() >= deadline:
        raise ConfigError(f"coordinator {address} unreachable after {timeout_s} s "
                          f"({e.strerror or e}); start process 0 first, or check the address and port") from None
      time.sleep(0.25)  # The coordinator may simply not be up yet.


def die_with_launcher() -> None:
  """Under jaxdp.launch (Linux), has the kernel SIGKILL this process when the launcher dies."""
  # Not SIGTERM: jax.distributed's preemption service handles it in C. Popped: a child must not take it as its own.
  launcher = os.environ.pop(ENV_LAUNCHER_PID, "")
  if not launcher.isdigit() or not sys.platform.startswith("linux"):
    return
  ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  if os.getppid() != int(launcher):  # The launcher died before prctl: no signal will come.
    os.kill(os.getpid(), signal.SIGKILL)


def settings() -> dict:
  """Coordinator address, process count and id from jaxdp's variables, else JAX's: whichever names an address."""
  ours = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)
  names = ours if os.environ.get(ENV_COORDINATOR) or not os.environ.get(JAX_ENV[0]) else JAX_ENV
  address, num_text, pid_text = (os.environ.get(name, "") for name in names)
  address = address or None
  missing = [name for name, text in zip(names[1:], (num_text, pid_text)) if address and not text.strip()]
  if missing:  # Else every process would join as one id, or JAX would guess a count.
    raise ConfigError(f"distributed: {names[0]}={address!r} is set but {' and '.join(missing)} not: set "
                      f"{names[1]} (the process count) and {names[2]} (0 to count - 1) in every process")
  try:  # Unset: no count, no id.
    num, pid = int(num_text.strip() or 0), int(pid_text.strip() or -1)
  except ValueError:
    raise ConfigError(f"distributed: the process count and id must be integers, got {num_text!r} and {pid_text!r} "
                      f"(from {names[1]} and {names[2]})") from None
  if address and (num < 1 or not 0 <= pid < num):
    raise ConfigError(f"distributed: coordinator {address!r} needs a process count >= 1 and 0 <= process id < "
                      f"count, got num_processes={num!r}, process_id={pid!r} (from {ENV_NUM_PROCESSES} and "
                      f"{ENV_PROCESS_ID}, or JAX's {JAX_ENV[1]} and {JAX_ENV[2]})")
  return {"coordinator_address": address, "num_processes": num, "process_id": pid}


def initialize() -> bool:
  """Joins the run (before any JAX computation) that the environment names or a cluster detected; whether it did."""
  global _joined, _restricted_to
  if _joined:
    return True
  die_with_launcher()
  explicit = settings()
  if not explicit["coordinator_address"] and not _cluster_detected():
    return False
  kwargs = dict(explicit) if explicit["coordinator_address"] else {}
  if (cluster := _cluster()) is not None and (ids := local_device_ids(cluster)) is not None:
    kwargs["local_device_ids"] = ids
  if explicit["coordinator_address"] and explicit["process_id"] != 0:
    wait_for_coordinator(explicit["coordinator_address"], INIT_TIMEOUT_S)
  try:
    jax.distributed.initialize(**kwargs, initialization_timeout=INIT_TIMEOUT_S,
                               heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
  except Exception as e:  # JAX raises several types (XlaRuntimeError, ValueError, ...) for the same failure.
    where = explicit["coordinator_address"] or "the auto-detected cluster"
    raise DistributedInitError(f"could not join the distributed run at {where} as process "
                               f"{explicit['process_id']} of {explicit['num_processes']} within {INIT_TIMEOUT_S} s: "
                               f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
  _joined = True
  _restricted_to = kwargs.get("local_device_ids") or []
  if path := os.environ.pop(ENV_JOINED_FILE, ""):  # Tells the launcher this process reached every other one.
    open(path, "w").close()
  return True


def joined() -> bool:
  """Whether this process already joined its run (`initialize` returned True)."""
  return _joined
