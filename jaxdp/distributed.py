"""Joining a multi-process run through `jax.distributed`, explicitly or by cluster auto-detection."""

import os

import jax
import ml_collections

from jaxdp.config import ConfigError

# Environment variables the local launcher (and any scheduler script) may set instead of the config.
ENV_COORDINATOR = "JAXDP_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAXDP_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXDP_PROCESS_ID"

# Markers of clusters where `jax.distributed.initialize()` finds every argument by itself.
_CLUSTER_SIZE_VARS = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def _cluster_detected() -> bool:
  """Whether this process is one of several under SLURM, Open MPI or a multi-host Cloud TPU slice."""
  if any(int(os.environ.get(v, "1") or 1) > 1 for v in _CLUSTER_SIZE_VARS):
    return True
  return "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")


class DistributedInitError(RuntimeError):
  """The processes of a multi-process run could not find each other in time."""


def settings(config: ml_collections.ConfigDict) -> dict:
  """Coordinator address, process count and id from `config.distributed`, else the environment."""
  c = config.get("distributed", ml_collections.ConfigDict())
  address = c.get("coordinator_address") or os.environ.get(ENV_COORDINATOR)
  num = c.get("num_processes") or int(os.environ.get(ENV_NUM_PROCESSES, 0))
  pid = c.get("process_id", -1)
  pid = pid if pid >= 0 else int(os.environ.get(ENV_PROCESS_ID, -1))
  if address and (num < 1 or not 0 <= pid < num):
    raise ConfigError(f"distributed: coordinator {address!r} needs num_processes >= 1 and 0 <= process_id < "
                      f"num_processes, got num_processes={num!r}, process_id={pid!r}")
  return {"coordinator_address": address, "num_processes": num, "process_id": pid}


def initialize(config: ml_collections.ConfigDict) -> bool:
  """Joins the run when it is multi-process (explicit, or a detected cluster); returns whether it did.

  Must run before any JAX computation. Fails after `distributed.init_timeout_s` instead of waiting forever.
  """
  c = config.get("distributed", ml_collections.ConfigDict())
  explicit = settings(config)
  auto = c.get("auto_detect", True) and _cluster_detected()
  if not explicit["coordinator_address"] and not auto:
    return False
  kwargs = {k: v for k, v in explicit.items() if explicit["coordinator_address"]}
  timeout = c.get("init_timeout_s", 300)
  try:
    jax.distributed.initialize(**kwargs, initialization_timeout=timeout,
                               heartbeat_timeout_seconds=c.get("heartbeat_timeout_s", 100))
  except Exception as e:  # JAX raises several types (XlaRuntimeError, ValueError, ...) for the same failure.
    where = explicit["coordinator_address"] or "the auto-detected cluster"
    raise DistributedInitError(f"could not join the distributed run at {where} as process "
                               f"{explicit['process_id']} of {explicit['num_processes']} within {timeout} s: "
                               f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
  return True
