"""CPU devices: `--cpu_devices N` / JAXDP_CPU_DEVICES, else `config.cpu_devices`, set before JAX starts its backends."""

import os
from collections.abc import Mapping

import ml_collections

from jaxdp.config import ConfigError

ENV_VAR = "JAXDP_CPU_DEVICES"
FLAG = "--cpu_devices"
KEY = "cpu_devices"
AUTO = "auto"
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"  # XLA's own way to ask (in XLA_FLAGS).
# XLA:CPU's one thread pool has max(PJRT_NPROC (else NPROC, else the cores), devices) threads, and Eigen splits a
# sum by the pool's size: the same op can round differently on 2 and 4 devices (parallel.invariant fixes the pool).
THREADS_ENV, THREADS_ENV_OLD = "PJRT_NPROC", "NPROC"
THREADS_ADDED = "JAXDP_PJRT_NPROC"  # The PJRT_NPROC jaxdp set (inherited by child processes), not the user's.


_chosen: int | None = None  # The count `use` set from `config.cpu_devices`, if any.
_left: str = "JAX's own (jaxdp's process set-up did not run)"  # Else why `use` set none.
_threads: str = ""  # The thread pool `fix_threads` set, as the start summary says it.


def simulate(count: int, asked: str = "") -> None:
  """Makes JAX see `count` CPU devices, as `asked` (`source`) says; must run before JAX first uses a device."""
  import jax
  try:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", count)
  except RuntimeError:  # JAX already started its backends: fine if it already has what was asked.
    if jax.device_count() != count or jax.devices()[0].platform != "cpu":
      # JAX reads XLA's own flag when it starts, whenever that is: what works after a JAX call in the script.
      raise ConfigError(f"{asked or f'{FLAG}={count}'} comes too late: a JAX call ran first, and JAX runs on "
                        f"{jax.device_count()} {jax.devices()[0].platform} device(s); set "
                        f"XLA_FLAGS={DEVICE_COUNT_FLAG}={count} before Python starts instead") from None


def pool_size(config: ml_collections.ConfigDict, cores: int, environ: Mapping[str, str]) -> int | None:
  """XLA:CPU's pool for invariant mode: as on `invariant_shards` devices (`environ` without ours); else None."""
  if not config.parallel.invariant:
    return None
  return max(_base_pool(environ, cores), config.parallel.invariant_shards)


def fix_threads(config: ml_collections.ConfigDict, cores: int) -> int | None:
  """Sets PJRT_NPROC to `pool_size` before JAX starts its CPU backend; returns it, or None where none was set."""
  global _threads
  if backends_started():  # Too late to set: refused where XLA's own pool is not the one the mode needs.
    import jax
    wanted = pool_size(config, cores, os.environ)
    started = max(_base_pool(os.environ, cores), jax.local_device_count())  # XLA's own choice.
    if wanted is not None and jax.default_backend() == "cpu" and started != wanted:
      # No compile option reaches XLA:CPU's Eigen convolutions (xla_cpu_multi_thread_eigen changes no bit): refused.
      raise ConfigError(f"parallel.invariant: JAX started before jaxdp, with XLA:CPU's thread pool at {started} "
                        f"threads, not {wanted}, and convolutions round by it, so the bits would depend on the device "
                        f"count; set {THREADS_ENV}={wanted} before Python starts")
    return None
  ours = os.environ.pop(THREADS_ADDED, None)
  if ours is not None and os.environ.get(THREADS_ENV) == ours:
    del os.environ[THREADS_ENV]  # A parent jaxdp process set it for its own run, not the user.
  if (threads := pool_size(config, cores, os.environ)) is not None:
    if os.environ.get(THREADS_ENV) != str(threads):  # Else the user's own, left unmarked for child processes.
      os.environ[THREADS_ENV] = os.environ[THREADS_ADDED] = str(threads)
    _threads = f"; XLA's thread pool: {threads}, as on {config.parallel.invariant_shards} devices (parallel.invariant)"
  return threads


def _base_pool(environ: Mapping[str, str], cores: int) -> int:
  """XLA's pool before its device count: PJRT_NPROC, else NPROC, else the cores."""
  users = [int(v) for v in map(environ.get, (THREADS_ENV, THREADS_ENV_OLD)) if v and v.strip().isdigit()]
  return users[0] if users else cores


def requested(argv: list[str]) -> int | None:
  """The device count asked for by `--cpu_devices N` / `--cpu_devices=N` or JAXDP_CPU_DEVICES."""
  for i, arg in enumerate(argv):
    if arg == FLAG and i + 1 < len(argv):
      return count_of(argv[i + 1])
    if arg.startswith(FLAG + "="):
      return count_of(arg.split("=", 1)[1])
  value = os.environ.get(ENV_VAR)
  return count_of(value) if value else None


def source(argv: list[str]) -> str:
  """How `requested(argv)` was asked, as the user wrote it: `--cpu_devices N` or JAXDP_CPU_DEVICES=N."""
  for i, arg in enumerate(argv):
    if arg == FLAG and i + 1 < len(argv):
      return f"{FLAG} {argv[i + 1]}"
    if arg.startswith(FLAG + "="):
      return arg
  return f"{ENV_VAR}={os.environ.get(ENV_VAR, '')}"


def count_of(text: str) -> int:
  """A positive device count from text; a ConfigError naming the text otherwise."""
  if (count := _positive(text)) is None:
    raise ConfigError(f"{FLAG} (or {ENV_VAR}) must be a positive integer, got {text!r}")
  return count


def _positive(text: str) -> int | None:
  """`text` as a positive integer (what a device count looks like, wherever it is given), else None."""
  return int(text) if text.strip().isdigit() and int(text) >= 1 else None


def choose(setting: object) -> int | None:
  """The count `config.cpu_devices = setting` asks for; None for "auto", JAX's own (docs/design-notes.md#cpu-devices)."""
  if setting == AUTO:
    return None
  text = str(setting) if isinstance(setting, (int, str)) and not isinstance(setting, bool) else ""
  if (asked := _positive(text)) is None:  # "N" (a string, so that --config.cpu_devices=N overrides it) or N.
    raise ConfigError(f"config.{KEY} must be {AUTO!r} or a positive integer, got {setting!r}")
  return asked


def use(config: ml_collections.ConfigDict) -> int | None:
  """Sets `config.cpu_devices` CPU devices in one process unless asked elsewhere or too late; the count, or None."""
  global _chosen, _left
  import jax
  if (jax.config.jax_num_cpu_devices != -1 or requested([]) is not None
      or DEVICE_COUNT_FLAG in os.environ.get("XLA_FLAGS", "")):
    _left = f"asked for ({FLAG}, {ENV_VAR}, jax_num_cpu_devices or XLA_FLAGS)"
    return None
  if backends_started():
    _left = "JAX's: it had started before jaxdp could choose"
    count, platform = jax.local_device_count(), jax.default_backend()
    if platform == "cpu" and (asked := choose(config[KEY])) is not None and asked != count:
      raise ConfigError(f"config.{KEY}={config[KEY]!r} comes too late: JAX already runs on {count} {platform} "
                        f"device(s); set it before the first JAX call, or {ENV_VAR} before Python starts")
    return None
  if config.parallel.num_devices:
    _left = "JAX's (config.parallel.num_devices is set)"
    return None
  if (count := choose(config[KEY])) is None:
    _left = f"JAX's own (config.{KEY} {AUTO!r})"
    return None
  jax.config.update("jax_num_cpu_devices", count)
  _chosen = count
  return count


def cores() -> int:
  """The cores this process may run on."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def backends_started() -> bool:
  """Whether JAX started its backends (after that, the CPU device count is fixed)."""
  try:  # No public way to ask.
    from jax._src.xla_bridge import backends_are_initialized
  except ImportError:  # A JAX without it (private API): `simulate` still refuses a count that comes too late.
    return False
  return backends_are_initialized()


def describe() -> str:
  """The start summary's line: this process's CPU device count and where it came from."""
  import jax
  count = jax.local_device_count()
  why = f"config.{KEY}={count}; {FLAG} N or config.{KEY} to choose" if _chosen == count else _left
  return f"{count}: {why}{_threads}"
