"""Simulated CPU devices: set XLA_FLAGS before JAX is imported (XLA reads them once)."""

import os
import sys

ENV_VAR = "JAXDP_CPU_DEVICES"
FLAG = "--cpu_devices"


def simulate(count: int) -> None:
  """Makes JAX, once imported, see `count` CPU devices."""
  if "jax" in sys.modules:
    raise RuntimeError(f"{FLAG}={count} must be set before jax is imported")
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={count}"])
  os.environ["JAX_PLATFORMS"] = "cpu"


def requested(argv: list[str]) -> int | None:
  """The device count asked for by `--cpu_devices N` / `--cpu_devices=N` or JAXDP_CPU_DEVICES."""
  for i, arg in enumerate(argv):
    if arg == FLAG and i + 1 < len(argv):
      return _positive(argv[i + 1])
    if arg.startswith(FLAG + "="):
      return _positive(arg.split("=", 1)[1])
  value = os.environ.get(ENV_VAR)
  return _positive(value) if value else None


def _positive(text: str) -> int:
  if not text.isdigit() or int(text) < 1:
    print(f"error: {FLAG} must be a positive integer, got {text!r}", file=sys.stderr)
    raise SystemExit(2)
  return int(text)
