"""What every command sets up in its process: jaxdp's log lines, JAX's compilation cache, a multi-process run."""

import logging
import os
import sys

import ml_collections

log = logging.getLogger("jaxdp")
DEFAULT_CACHE_DIR = "~/.cache/jaxdp/xla"  # Where JAX's compilation cache is when JAX has none.


def setup_logging() -> None:
  """jaxdp's own lines at INFO on stdout, bare; libraries stay at WARNING."""
  from jaxdp.runtime import distributed  # JAX: not before a command needs it (`--help` starts without it).
  if os.environ.get(distributed.ENV_PRINT_TO_STDERR):  # Under jaxdp.launch: see launch.GLOO_PIECES.
    sys.stdout = sys.stderr
  logging.basicConfig(format="%(message)s", handlers=[_Stdout()], force=True)
  log.setLevel(logging.INFO)  # TFDS's bars are off in a command (`quiet.command`, from `cli.start`).


class _Stdout(logging.StreamHandler):
  """Writes to `sys.stdout` as it is at each line (a capture or redirect since setup), never to a stale stream."""

  stream = property(lambda self: sys.stdout, lambda self, value: None)  # StreamHandler's own setting is ignored.


def use_compilation_cache() -> None:
  """Points JAX's compilation cache at DEFAULT_CACHE_DIR for every program, unless JAX has a directory or has it off."""
  import jax
  if jax.config.jax_compilation_cache_dir or not jax.config.jax_enable_compilation_cache:
    return  # The user's (JAX_COMPILATION_CACHE_DIR, or set in Python), or off.
  # JAX opens its cache at the first compile after a directory is set: a process that already compiled without one
  # (a notebook) uses it from its next compile.
  jax.config.update("jax_compilation_cache_dir", os.path.expanduser(DEFAULT_CACHE_DIR))
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def no_cache_across_cpu_processes() -> bool:
  """Turns JAX's compilation cache off (the user's too) in a joined run of several CPU processes; whether it did."""
  import jax
  if jax.process_count() == 1 or jax.default_backend() != "cpu" or not jax.config.jax_enable_compilation_cache:
    return False
  # A process's cache key holds its own devices and only process 0 writes, so with a warm cache process 0 runs
  # loaded executables while the others compile theirs: on jax 0.12 (XLA:CPU, gloo) the two wait for each other in
  # the first all-reduce forever. The others compile anyway, so the cache never shortened such a run. Before the
  # first compile: JAX decides once per process whether it uses the cache.
  jax.config.update("jax_enable_compilation_cache", False)
  return True


def init(config: ml_collections.ConfigDict) -> None:
  """Turns the compile cache on; joins the run the environment names, else sets the CPU devices; quiets process > 0."""
  import jax
  use_compilation_cache()
  from jaxdp.runtime import cpu_devices, distributed
  cpu_devices.fix_threads(config, cpu_devices.cores())  # Before JAX starts its CPU backend.
  deterministic_gpu(config, cpu_devices.backends_started())
  if not distributed.initialize():
    cpu_devices.use(config)  # One process: its CPU devices (config.cpu_devices), before JAX starts its backends.
  else:
    no_cache_across_cpu_processes()
    if jax.process_index() != 0:
      log.setLevel(logging.WARNING)


def deterministic_gpu(config: ml_collections.ConfigDict, started: bool) -> None:
  """In invariant mode, XLA's deterministic GPU ops for every program of the process, set before JAX starts."""
  from jaxdp.strategies.invariant import DETERMINISTIC_GPU  # JAX: imported, not started.
  flags = os.environ.get("XLA_FLAGS", "")
  if not config.parallel.invariant or started or f"--{DETERMINISTIC_GPU}" in flags:
    return  # Once JAX started, the mesh backend's own compile options hold it (`Invariant.compiler_options`).
  # First: XLA ignores every flag after one it does not know.
  os.environ["XLA_FLAGS"] = f"--{DETERMINISTIC_GPU}=true {flags}".strip()


def join(config: ml_collections.ConfigDict) -> None:
  """`init` for the Python API, as the CLI does before its command (nothing once joined), JAXDP_CPU_DEVICES first."""
  from jaxdp.runtime import cpu_devices, distributed
  if distributed.joined():  # The CLI joined before its command: its devices are the run's (global count now).
    return
  if (count := cpu_devices.requested([])) is not None:  # JAXDP_CPU_DEVICES, as the CLI reads it; launched or not.
    cpu_devices.simulate(count, cpu_devices.source([]))
  init(config)
