"""FLOPs of a compiled step (XLA's cost analysis) and the peak FLOP/s of known devices, for MFU."""

from typing import Any

import jax

# Dense bfloat16 peak FLOP/s per JAX device, from the vendors' data sheets (without sparsity).
# TPU v2/v3 expose each of a chip's two cores as a device; from v4 on a device is a whole chip.
TPU_PEAK_FLOPS: dict[str, float] = {
    "TPU v2": 22.5e12,
    "TPU v3": 61.5e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,   # v5e
    "TPU v5e": 197e12,
    "TPU v5": 459e12,        # v5p
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,   # v6e (Trillium)
    "TPU v6e": 918e12,
}
# GPU device kinds carry a vendor prefix and variants ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"):
# matched by substring, the more specific names first.
GPU_PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),        # SXM
    ("H200", 989e12),
    ("H800", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("V100", 125e12),
    ("T4", 65e12),
)


def step_flops(jitted: Any, *args: Any) -> float | None:
  """FLOPs per device of one call of `jitted(*args)` (jit or pmap), from XLA's cost analysis of the compiled program,
  which the next call reuses; None where the backend has none. A loop body is counted once."""
  try:
    compiled = jitted.lower(*args).compile()
  except (NotImplementedError, RuntimeError):  # A backend without cost analysis: report no FLOPs, keep training.
    return None
  return compiled_flops(compiled)


def lowered_flops(jitted: Any, *args: Any) -> float | None:
  """FLOPs per device of one call of `jitted(*args)`, from the program before XLA optimizes it (nothing compiled;
  within a few % of the compiled count)."""
  try:
    lowered = jitted.lower(*args)
  except (NotImplementedError, RuntimeError):
    return None
  return compiled_flops(lowered)  # A lowered program has the same cost_analysis() as a compiled one.


def compiled_flops(compiled: Any) -> float | None:
  """FLOPs per device of one run of a compiled (or lowered) program (XLA's cost analysis); None if unknown."""
  flops = cost_analysis(compiled).get("flops")
  return float(flops) if flops and flops > 0 else None


def cost_analysis(compiled: Any) -> dict[str, float]:
  """XLA's cost analysis of a compiled or lowered program ("flops", "bytes accessed", ...); {} where there is none."""
  try:
    analysis = compiled.cost_analysis()
  except (NotImplementedError, RuntimeError):
    return {}
  if isinstance(analysis, (list, tuple)):  # Older JAX: one dict per program.
    analysis = analysis[0] if analysis else None
  return analysis or {}


def peak_flops(device: jax.Device) -> float | None:
  """Dense bf16 peak FLOP/s of one device of a known kind; None otherwise (e.g. every CPU)."""
  kind = device.device_kind
  if device.platform == "tpu":
    return TPU_PEAK_FLOPS.get(kind)
  if device.platform == "gpu":
    return next((peak for name, peak in GPU_PEAK_FLOPS if name in kind), None)
  return None


def mfu(flops_per_step: float | None, step_seconds: float, peak: float | None) -> float | None:
  """Model FLOPs utilization: achieved FLOP/s per device over the device's peak; None if unknown."""
  if not flops_per_step or not peak or step_seconds <= 0:
    return None
  return flops_per_step / step_seconds / peak
