"""Simulated CPU devices (`--cpu_devices N` or JAXDP_CPU_DEVICES=N), set through JAX's own config option."""

import os

from jaxdp.config import ConfigError

ENV_VAR = "JAXDP_CPU_DEVICES"
FLAG = "--cpu_devices"


def simulate(count: int) -> None:
  """Makes JAX see `count` CPU devices; must run before JAX first uses a device (any JAX import is fine)."""
  import jax
  try:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", count)
  except RuntimeError:  # JAX already started its backends: fine if it already has what was asked.
    if jax.device_count() != count or jax.devices()[0].platform != "cpu":
      raise ConfigError(f"{FLAG}={count} comes too late: JAX already runs on {jax.device_count()} "
                        f"{jax.devices()[0].platform} device(s)") from None


def requested(argv: list[str]) -> int | None:
  """The device count asked for by `--cpu_devices N` / `--cpu_devices=N` or JAXDP_CPU_DEVICES."""
  for i, arg in enumerate(argv):
    if arg == FLAG and i + 1 < len(argv):
      return count_of(argv[i + 1])
    if arg.startswith(FLAG + "="):
      return count_of(arg.split("=", 1)[1])
  value = os.environ.get(ENV_VAR)
  return count_of(value) if value else None


def count_of(text: str) -> int:
  """A positive device count from text; a ConfigError naming the text otherwise."""
  if not text.strip().isdigit() or int(text) < 1:
    raise ConfigError(f"{FLAG} (or {ENV_VAR}) must be a positive integer, got {text!r}")
  return int(text)
