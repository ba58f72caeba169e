"""`inspect --topology NAME [--max_batch]`: the train step compiled ahead of time for a TPU slice: fit and roofline."""

import dataclasses
import os
import re
import sys
from typing import Any

import jax
import ml_collections

from jaxdp import build
from jaxdp import config as config_lib
from jaxdp.config import ConfigError
from jaxdp.report import flops, summary, units
from jaxdp.tools import hlo

GiB = 2**30
TIGHT = 0.02  # A margin under this share of HBM is flagged: libtpu keeps part of HBM for itself.


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU chip generation's data sheet (Google Cloud TPU system architecture pages)."""
  generation: str
  hbm_bytes: int
  hbm_bytes_per_s: float
  ici_bytes_per_s: float  # Per chip, all links together (the data sheet's "interchip interconnect BW").


# device_kind -> chip. The topology name's generation ("v5e") and JAX's device kind ("TPU v5 lite") both map here.
CHIPS: dict[str, Chip] = {
    "TPU v4": Chip("v4", 32 * GiB, 1200e9, 2400e9 / 8),
    "TPU v5 lite": Chip("v5e", 16 * GiB, 819e9, 1600e9 / 8),
    "TPU v5": Chip("v5p", 95 * GiB, 2765e9, 4800e9 / 8),
    "TPU v6 lite": Chip("v6e", 32 * GiB, 1640e9, 3584e9 / 8),
}
GENERATIONS = tuple(c.generation for c in CHIPS.values())
_TPU_NAME = re.compile(rf"^({'|'.join(GENERATIONS)}):\d+x\d+(x\d+)?$")
ACCEPTED = (f"GENERATION:AxB or GENERATION:AxBxC with GENERATION one of {', '.join(GENERATIONS)} "
            "(e.g. v5e:2x2, v5e:4x4, v6e:8x8, v4:2x2x1, v5p:4x4x4)")
GPU_NAMES = ("gpu", "cuda", "rocm", *(name.lower() for name, _ in flops.GPU_PEAK_FLOPS))  # "h100:8", "gpu"


def ring_share(kind: str, n: int) -> float:
  """The share of a collective's full buffer that each of `n` devices sends (and receives) in the ring algorithm."""
  if n <= 1:
    return 0.0
  return {"all-reduce": 2 * (n - 1) / n, "reduce-scatter": (n - 1) / n, "all-gather": (n - 1) / n,
          "all-to-all": (n - 1) / n, "collective-permute": 1.0}[kind]


def devices(name: str) -> list[jax.Device]:
  """The devices of TPU topology `name` (compile-only devices); ConfigError for an unknown name or no libtpu."""
  if not _TPU_NAME.match(name):
    raise ConfigError(f"unknown topology {name!r}; accepted forms: {ACCEPTED}")
  # libtpu warns about the TPU host it is not on unless these are set; they do not change the topology.
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
  # Compiling touches no chip: let several processes load libtpu at once (else its lock file refuses the second).
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies
  try:
    return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
  except (RuntimeError, ImportError) as e:  # Not a JaxRuntimeError: no TPU plugin installed.
    reason = str(e).splitlines()[0]
    if "lockfile" in reason:
      raise ConfigError(f"another process holds libtpu ({reason})") from None
    if not isinstance(e, jax.errors.JaxRuntimeError) or any(w in reason.lower() for w in ("libtpu", "no module",
                                                                                           "not found")):
      raise ConfigError(f"--topology {name} needs libtpu: pip install -e \".[tpu]\" ({reason})") from None
    raise ConfigError(f"topology {name!r} was refused: {reason}; accepted forms: {ACCEPTED}") from None


def _for_topology(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config as compiled for a slice: every device of it, the mesh backend (pmap has no AOT for topologies)."""
  config = config_lib.with_defaults(config)
  if config.parallel.backend != "mesh":
    raise ConfigError(f"--topology compiles the mesh backend; got parallel.backend {config.parallel.backend!r}")
  config.parallel.num_devices = 0
  return config


def report(config: ml_collections.ConfigDict, name: str, devs: list[jax.Device] | None = None) -> dict[str, Any]:
  """Compiles `config`'s train step for topology `name` and reports memory, fit, collectives, FLOPs, roofline."""
  devs = devs or devices(name)
  parts = build.build(_for_topology(config), devices=devs)
  abstract = jax.eval_shape(parts.init)
  state, batch = hlo.abstract_inputs(parts, abstract)
  n, kind = parts.backend.num_devices, parts.backend.devices[0].device_kind  # What the step was built over.
  chip = CHIPS.get(kind)
  capacity = chip.hbm_bytes if chip else None
  lowered = parts.train_step.lower(state, batch)
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:  # libtpu refuses a program that does not fit its HBM.
    arguments = summary.tree_bytes(state) + summary.tree_bytes(batch)
    short = _out_of_memory(str(e), arguments)
    if short is None:
      raise
    needed, capacity = short
    mem = {"argument_bytes": arguments, "temp_bytes": needed - arguments, "output_bytes": 0, "alias_bytes": 0,
           "total_bytes": needed, "source": "libtpu's out-of-memory error (a lower bound)"}
    compiled = None
  else:
    mem = hlo.memory(compiled) or {}
  needed = mem.get("total_bytes")
  ops, _ = hlo.parse_compiled(compiled.as_text() or "" if compiled else "", n)
  collectives = {k: {"count": c["count"], "bytes": c["bytes"]} for k, c in hlo.tally(ops).items() if c["count"]}
  step_flops = flops.compiled_flops(compiled) if compiled else None
  cost, peak = flops.cost_analysis(compiled) if compiled else {}, flops.TPU_PEAK_FLOPS.get(kind)
  hbm_traffic = cost.get("bytes accessed")
  # Lower bounds of the step time: compute at peak, HBM traffic, ring collectives (`ring_share`) at ICI.
  bounds = {"compute_s": step_flops / peak if step_flops and peak else None,
            "hbm_s": hbm_traffic / chip.hbm_bytes_per_s if hbm_traffic and chip else None,
            "collectives_s": sum(ring_share(k, n) * c["bytes"] for k, c in collectives.items())
            / chip.ici_bytes_per_s if chip else None}
  step_s = max((b for b in bounds.values() if b is not None), default=None)
  return {
      "topology": name, "device_kind": kind, "num_devices": n, "global_batch": parts.layout.global_batch,
      "per_device_batch": parts.layout.per_device_batch, "options": hlo.run_options(parts),
      "per_device_bytes": needed, "memory": mem, "device_memory_bytes": capacity,
      # XLA:TPU places every buffer at compile time and refuses a program over HBM: compiled means it fits.
      "fits": compiled is not None,
      "margin_bytes": None if needed is None or capacity is None else capacity - needed,
      "collectives": collectives, "flops_per_step": step_flops,
      "roofline": {**bounds, "step_s": step_s, "xla_optimal_s": cost.get("optimal_seconds")},
  }


_SIZE = r"([\d.]+)([KMGT]?)"
# libtpu's two out-of-memory messages: temporaries alone over HBM, or the whole program (then: by how much).
_OOM_TEMPS = re.compile(rf"total memory required for HLO temporaries \({_SIZE}\) exceeds available HBM \({_SIZE}\)")
_OOM_TOTAL = re.compile(rf"Used {_SIZE} of {_SIZE} hbm\. Exceeded hbm capacity by {_SIZE}")


def _bytes(number: str, unit: str) -> int:
  return int(float(number) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[unit])


def _out_of_memory(message: str, arguments: int) -> tuple[int, int] | None:
  """(bytes needed, usable HBM bytes) from libtpu's RESOURCE_EXHAUSTED message; None if it is another error."""
  if m := _OOM_TEMPS.search(message):
    return arguments + _bytes(*m.group(1, 2)), _bytes(*m.group(3, 4))
  if m := _OOM_TOTAL.search(message):
    usable = _bytes(*m.group(3, 4))
    return usable + _bytes(*m.group(5, 6)), usable
  return None


def max_batch(config: ml_collections.ConfigDict, name: str) -> dict[str, Any]:
  """The largest global batch whose step fits the chips (a multiple of what the config needs), and its report."""
  devs = devices(name)
  config = _for_topology(config)
  unit = len(devs) * config.grad_accum_steps
  if config.parallel.invariant:
    unit = max(unit, config.parallel.invariant_shards * config.grad_accum_steps)

  def fits(multiple: int) -> dict[str, Any] | None:
    trial = config.copy_and_resolve_references()
    trial.batch_size = trial.eval_batch_size = multiple * unit
    r = report(trial, name, devs)
    return r if r["fits"] else None

  lo, hi, best = 0, max(1, config.batch_size // unit), None  # Multiples of `unit`, from the config's batch.
  while (r := fits(hi)) is not None:  # Doubling until it no longer fits, then bisection.
    lo, best, hi = hi, r, hi * 2
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if (r := fits(mid)) is not None:
      lo, best = mid, r
    else:
      hi = mid
  if best is None:
    raise ConfigError(f"even the smallest global batch ({unit}) does not fit on {name}")
  return {**best, "max_batch": lo * unit, "batch_unit": unit}


def format_report(r: dict[str, Any]) -> str:
  """The report as aligned text."""
  size, si, mem, roof = units.binary_bytes, units.si, r["memory"], r["roofline"]
  fit = f"{'yes' if r['fits'] else 'NO'} ({size(abs(r['margin_bytes']))} {'to spare' if r['fits'] else 'short'})"
  if r["fits"] and r["margin_bytes"] < TIGHT * r["device_memory_bytes"]:
    fit += f"; tight: libtpu keeps part of the {size(r['device_memory_bytes'])} HBM of a {r['device_kind']} for itself"
  lines = [
      f"jaxdp inspect --topology {r['topology']}: {r['num_devices']} x {r['device_kind']}, global batch "
      f"{r['global_batch']} = {r['num_devices']} x {r['per_device_batch']}"
      + (f" (largest that fits, in steps of {r['batch_unit']})" if "max_batch" in r else ""),
      f"  per chip    needs {size(r['per_device_bytes'])} (arguments {size(mem['argument_bytes'])} + temporaries "
      f"{size(mem['temp_bytes'])} + outputs {size(mem['output_bytes'])} - donated {size(mem['alias_bytes'])}); "
      f"has {size(r['device_memory_bytes']) if r['device_memory_bytes'] else 'unknown'} HBM",
      f"  fits        {fit}",
      f"  FLOPs/step  {si(r['flops_per_step']) + 'FLOP per chip' if r['flops_per_step'] else 'unknown'}",
      "  collectives " + (", ".join(f"{k} x{c['count']} {size(c['bytes'])}" for k, c in r["collectives"].items())
                          or "none"),
      "  roofline    " + ", ".join(
          f"{label} {'unknown' if roof[key] is None else f'{roof[key] * 1e3:.3g} ms'}" for label, key in (
              ("compute", "compute_s"), ("HBM", "hbm_s"), ("ICI", "collectives_s"), ("step >=", "step_s"),
              ("XLA's estimate", "xla_optimal_s"))),
  ]
  return "\n".join(lines)


def slice_report(config: ml_collections.ConfigDict, name: str, search: bool) -> dict[str, Any] | None:
  """The --topology report (--max_batch: of the largest batch that fits); None, said on stderr, for GPUs."""
  if name.split(":")[0].split("x")[0].lower() in GPU_NAMES:  # JAX has no GPU topology to compile for.
    print(f"note: --topology {name}: JAX compiles for GPUs only on a host with that GPU (there is no GPU topology "
          f"description); showing the report for this machine's devices instead", file=sys.stderr)
    return None
  return max_batch(config, name) if search else report(config, name)
