"""XLA:CPU's flags chosen from what the machine is, put in XLA_FLAGS before JAX starts its CPU backend.

`config.xla_cpu_flags`: "auto" (the choice below), "" (XLA's own defaults) or explicit flags. A flag the
user's XLA_FLAGS already sets is left as the user set it. The choices and the measurements behind them:
experiments/xla_cpu_defaults.md; a machine unlike those measured keeps XLA's defaults.
"""

import dataclasses
import os
import platform

import ml_collections

from jaxdp.config import ConfigError

ENV = "XLA_FLAGS"
ENV_ADDED = "JAXDP_XLA_CPU_ADDED"  # The flags jaxdp added to XLA_FLAGS (inherited by child processes).
AUTO = "auto"
KEY = "xla_cpu_flags"
MEASURED = "experiments/xla_cpu_defaults.md"
# XLA's own convolutions; YNNPACK keeps the dots and reductions (XLA's default list: individual_dot,
# individual_convolution, reduce). Faster for one process's convolutions (ResNet-18, the CNN at 128 rows a device,
# on AVX2 and AVX-512), but not the default run end to end, and slower for two processes' small convolutions: an
# opt-in (config.xla_cpu_flags), not the choice. All YNNPACK fusions off was slower for the matmul and the MLPs;
# YNNPACK's reductions off, slower for the GPT.
NO_YNN_CONVOLUTIONS = "--xla_cpu_experimental_ynn_fusion_type=-individual_convolution"
# oneDNN's matmuls for every dot (its pass claims dots before YNNPACK's; YNNPACK keeps the convolutions). YNNPACK
# takes no dot that contracts its lhs's dimension 0, the weight gradients X^T dY of every dense layer, so XLA runs
# those in Eigen, at half YNNPACK's and oneDNN's speed on one thread. An opt-in: faster for the MLP under
# jaxdp.launch, not for the default run (one process, 8 devices), and a choice by process count would make the
# same run's numbers differ between process counts (`choose`).
# jaxdp.models.dense_dot already runs the built-in dense layers' weight gradients as NN dots in YNNPACK, at
# oneDNN's speed, with neither flag (experiments/dense_parts.md).
ONEDNN_DOTS = ("--xla_cpu_use_onednn=true", "--xla_cpu_experimental_onednn_fusion_type=individual_dot")
MAX_MEASURED_CORES = 2  # The most cores of a machine the choices were measured on.


@dataclasses.dataclass(frozen=True)
class Machine:
  """The facts the choice depends on."""
  arch: str  # platform.machine(): x86_64, aarch64, ...
  isa: frozenset[str]  # The CPU's flags in /proc/cpuinfo (avx2, avx512f, ...); empty where unknown.
  cores: int  # Cores this process may run on.
  # jaxdp processes sharing those cores (jaxdp.launch's --num_processes), else 1: with as many as cores, each
  # runs on about one core.
  processes_per_host: int


@dataclasses.dataclass(frozen=True)
class Choice:
  """The flags for a machine and why, as the start summary says it."""
  flags: tuple[str, ...]
  why: str


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What `apply` did: the choice, the flags it added to XLA_FLAGS, those the user's XLA_FLAGS set first."""
  choice: Choice
  added: tuple[str, ...] = ()
  users: tuple[str, ...] = ()
  too_late: bool = False  # JAX's CPU backend had started: XLA_FLAGS is read only then.


_outcome: Outcome | None = None  # This process's, once `apply` ran.


def choose(machine: Machine, setting: str = AUTO) -> Choice:
  """The flags for `machine` under `config.xla_cpu_flags = setting`; a pure function of its arguments."""
  if setting != AUTO:
    flags = tuple(setting.split())
    if bad := [f for f in flags if not f.startswith("--xla_")]:
      raise ConfigError(f"config.{KEY} must be {AUTO!r}, '' or XLA flags (--xla_...), got {' '.join(bad)!r}")
    return Choice(flags, f"{KEY}={setting!r}" if flags else f"XLA's defaults ({KEY}='')")
  if machine.arch not in ("x86_64", "AMD64") or "avx2" not in machine.isa:
    return Choice((), f"XLA's defaults (not measured on {machine.arch} without AVX2)")
  if machine.cores > MAX_MEASURED_CORES:
    return Choice((), f"XLA's defaults (not measured on more than {MAX_MEASURED_CORES} cores)")
  if "avx512f" in machine.isa:
    # As on AVX2: XLA's own convolutions help large convolution batches on one process but not the default run's
    # CNN end to end, and YNNPACK off or oneDNN's dots slow the dense models (xla_cpu_defaults.md, Runs 5 and 6).
    return Choice((), f"XLA's defaults (measured on AVX-512 on AMD Zen 4 and Zen 5, 2 cores, not on other AVX-512 "
                      f"CPUs: no flag set was faster for every workload; {MEASURED})")
  if 1 < machine.processes_per_host >= machine.cores:
    # oneDNN's dots are faster here (dense_parts.md), but the flags must not depend on the process count: a run
    # on 2 processes then differs from the same run on 1 in the last bits, and resuming a run on another process
    # count, or without a lost rank, is bitwise only with the same kernels everywhere (tests/test_restarts.py).
    return Choice((), f"XLA's defaults (measured on AVX2 without AVX-512, {machine.processes_per_host} processes on "
                      f"{machine.cores} cores: oneDNN's dots are faster for dense layers but, chosen by process "
                      f"count, would break bitwise resume on another count; opt in with {KEY}="
                      f"'{' '.join(ONEDNN_DOTS)}'; {MEASURED})")
  return Choice((), f"XLA's defaults (measured on AVX2 without AVX-512, {machine.cores} cores, one process: no "
                    f"flag set was faster for every workload; {MEASURED})")


def this_machine() -> Machine:
  """This process's machine: /proc/cpuinfo's flags, the cores it may run on, its launcher's process count."""
  from jaxdp.runtime import distributed  # Its names only; JAX loads with it, and has not started a backend.
  isa: frozenset[str] = frozenset()
  try:
    with open("/proc/cpuinfo") as f:
      isa = frozenset(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
  except OSError:  # Not Linux: no flags known, so XLA's defaults.
    pass
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
  local = os.environ.get(distributed.ENV_LAUNCHER_PID) and os.environ.get(distributed.ENV_NUM_PROCESSES, "")
  return Machine(platform.machine(), isa, cores, int(local) if local and local.isdigit() else 1)


def merge(xla_flags: str, flags: tuple[str, ...]) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
  """(XLA_FLAGS with `flags` added, the flags added, the flags left out because `xla_flags` sets them)."""
  users = {f.split("=", 1)[0] for f in xla_flags.split()}
  added = tuple(f for f in flags if f.split("=", 1)[0] not in users)
  left = tuple(f for f in flags if f not in added)
  return " ".join([*xla_flags.split(), *added]), added, left


def apply(config: ml_collections.ConfigDict, machine: Machine | None = None) -> Outcome:
  """Adds the flags `config.xla_cpu_flags` asks for to XLA_FLAGS, unless JAX's backends already started."""
  global _outcome
  choice = choose(machine or this_machine(), config[KEY])
  if backends_started():
    if _outcome is None or _outcome.choice != choice:  # A second run in the process keeps the first's flags.
      _outcome = Outcome(choice, too_late=True)
    return _outcome
  # Flags an earlier apply added (this process's, or its parent's: a test, a launcher) are not the user's.
  ours = set(os.environ.get(ENV_ADDED, "").split())
  users_own = " ".join(f for f in os.environ.get(ENV, "").split() if f not in ours)
  environ, added, users = merge(users_own, choice.flags)
  if environ or ENV in os.environ:
    os.environ[ENV] = environ
  os.environ[ENV_ADDED] = " ".join(added)
  _outcome = Outcome(choice, added, users)
  return _outcome


def describe(outcome: Outcome | None = None) -> str:
  """The start summary's line: what XLA:CPU runs with and why, and how to change it."""
  outcome = outcome or _outcome
  if outcome is None:
    return "XLA's defaults or the user's XLA_FLAGS (jaxdp set none: its process start-up did not run)"
  text = outcome.choice.why
  if outcome.too_late and outcome.choice.flags:
    text += (f"; not applied: JAX had started before jaxdp (set XLA_FLAGS='{' '.join(outcome.choice.flags)}' "
             "before JAX starts)")
  if outcome.users:
    text += f"; XLA_FLAGS sets {', '.join(f.split('=', 1)[0] for f in outcome.users)} (kept)"
  return text + f"; set {KEY} to override"


def backends_started() -> bool:
  """Whether JAX started its backends (after that, XLA_FLAGS and the CPU device count are fixed)."""
  try:  # No public way to ask; XLA reads XLA_FLAGS when the first backend starts.
    from jax._src.xla_bridge import backends_are_initialized
  except ImportError:  # A JAX without it (private API): only the "too late" note of the start summary is lost.
    return False
  return backends_are_initialized()
