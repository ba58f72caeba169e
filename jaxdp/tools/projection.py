"""`inspect --project COUNTS [--interconnect NAME]`: an alpha-beta model of one data-parallel step on N devices.

step(N) = compute (the real step timed on one device here) + the all-reduce of the gradient bytes the compiled step
sends, on a named interconnect; weak scaling. The model and what it leaves out: docs/tools.md#inspect.
"""

import dataclasses
import math
import statistics
import time
from typing import Any

import jax
import ml_collections

from jaxdp import build
from jaxdp import config as config_lib
from jaxdp.config import ConfigError
from jaxdp.report import summary, units
from jaxdp.tools import hlo


@dataclasses.dataclass(frozen=True)
class Interconnect:
  """A link's all-reduce parameters: bandwidth per device (one direction) and per-message latency."""
  bytes_per_s: float  # beta = 1 / bytes_per_s
  latency_s: float    # alpha
  source: str
  per_operand: bool = False  # One call per all-reduced tensor (gloo), not per all-reduce instruction.


# Data sheets and published NCCL/TPU figures; latencies are typical small-message figures, an assumption.
# gloo-localhost is measured, not from a data sheet (docs/design-notes.md#projection-interconnect).
INTERCONNECTS: dict[str, Interconnect] = {
    "nvlink4": Interconnect(450e9, 3e-6, "H100 NVLink 4: 900 GB/s bidirectional = 450 GB/s per direction"),
    "ib-ndr": Interconnect(50e9, 5e-6, "InfiniBand NDR: 400 Gb/s per GPU's port = 50 GB/s per direction"),
    "tpu-v4": Interconnect(300e9, 2e-6, "TPU v4 ICI: 2400 Gb/s per chip, all links (jaxdp.topology.CHIPS)"),
    "tpu-v5e": Interconnect(200e9, 2e-6, "TPU v5e ICI: 1600 Gb/s per chip, all links (jaxdp.topology.CHIPS)"),
    "tpu-v5p": Interconnect(600e9, 2e-6, "TPU v5p ICI: 4800 Gb/s per chip, all links (jaxdp.topology.CHIPS)"),
    "tpu-v6e": Interconnect(448e9, 2e-6, "TPU v6e ICI: 3584 Gb/s per chip, all links (jaxdp.topology.CHIPS)"),
    "eth-25g": Interconnect(25e9 / 8, 30e-6, "data-center Ethernet 25 GbE, TCP: 3.1 GB/s, ~30 us per message"),
    "eth-100g": Interconnect(100e9 / 8, 20e-6, "data-center Ethernet 100 GbE, TCP: 12.5 GB/s, ~20 us per message"),
    "gloo-localhost": Interconnect(1.25e9, 220e-6, "gloo over TCP on localhost, 2 processes, fitted "
                                   "(docs/design-notes.md#projection-interconnect)", True),
}
DEFAULT_INTERCONNECT = "ib-ndr"
ACCUM = 4  # The gradient-accumulation what-if's micro-batches per step.


def interconnect(name: str) -> Interconnect:
  """The table's entry; ConfigError listing the known names for any other."""
  if name not in INTERCONNECTS:
    raise ConfigError(f"unknown interconnect {name!r}; known: {', '.join(INTERCONNECTS)}")
  return INTERCONNECTS[name]


def parse_counts(text: str) -> list[int]:
  """'8,64,512' -> [8, 64, 512]; ConfigError for anything but positive integers."""
  counts = [int(c) if c.strip().isdigit() else 0 for c in text.split(",") if c.strip()]
  if not counts or any(c < 1 for c in counts):
    raise ConfigError(f"--project needs device counts like 8,64,512; got {text!r}")
  return counts


def ring_share(kind: str, n: int) -> float:
  """The share of a collective's full buffer that each of `n` devices sends (and receives) in the ring algorithm."""
  if n <= 1:
    return 0.0
  return {"all-reduce": 2 * (n - 1) / n, "reduce-scatter": (n - 1) / n, "all-gather": (n - 1) / n,
          "all-to-all": (n - 1) / n, "collective-permute": 1.0}[kind]


def ring_allreduce_s(n: int, nbytes: float, link: Interconnect, calls: int = 1) -> float:
  """Ring: each device sends and receives 2 (n-1)/n of the buffer, in 2 (n-1) latency-bound rounds per call."""
  return ring_share("all-reduce", n) * nbytes / link.bytes_per_s + calls * 2 * (n - 1) * link.latency_s


def tree_allreduce_s(n: int, nbytes: float, link: Interconnect, calls: int = 1) -> float:
  """Pipelined (double binary) tree: reduce up and broadcast down, 2 x the buffer, 2 ceil(log2 n) latencies."""
  if n <= 1:
    return 0.0
  return 2 * nbytes / link.bytes_per_s + calls * 2 * math.ceil(math.log2(n)) * link.latency_s


# ZeRO-1: a ring reduce-scatter of the gradients and a ring all-gather of the parameters, (n-1)/n of the buffer in
# n-1 rounds each: what a ring all-reduce moves, in as many rounds (never a tree).
reduce_scatter_all_gather_s = ring_allreduce_s


def allreduce_s(n: int, nbytes: float, link: Interconnect, calls: int = 1) -> tuple[float, str]:
  """The faster of ring and tree (as NCCL chooses): (seconds, algorithm)."""
  ring, tree = ring_allreduce_s(n, nbytes, link, calls), tree_allreduce_s(n, nbytes, link, calls)
  return (ring, "ring") if ring <= tree else (tree, "tree")


def _point(n: int, compute_s: float, comm_s: float, samples: int) -> dict[str, float]:
  """Step time, samples/s, efficiency (the 1-device step's share of this one) and communication share."""
  step = compute_s + comm_s
  return {"step_s": step, "samples_per_s": n * samples / step, "efficiency": compute_s / step,
          "comm_share": comm_s / step}


def model(counts: list[int], compute_s: float, batch: int, grad_bytes: float, calls: int, link: Interconnect,
          accum: int = ACCUM) -> list[dict[str, Any]]:
  """Per N: step time, samples/s, scaling efficiency (compute / step), communication share, and what-ifs."""
  rows = []
  for n in counts:
    comm, algorithm = allreduce_s(n, grad_bytes, link, calls)
    row = {"devices": n, "global_batch": n * batch, "compute_s": compute_s, "comm_s": comm,
           "algorithm": algorithm, "ring_s": ring_allreduce_s(n, grad_bytes, link, calls),
           "tree_s": tree_allreduce_s(n, grad_bytes, link, calls),
           **_point(n, compute_s, comm, batch)}
    bf16, _ = allreduce_s(n, grad_bytes / 2, link, calls)
    zero = reduce_scatter_all_gather_s(n, grad_bytes, link, calls)
    row["what_if"] = {
        "bf16_allreduce": _point(n, compute_s, bf16, batch),
        # k micro-batches per step, one all-reduce: the communication is amortized over k x the samples.
        f"grad_accum_{accum}": _point(n, accum * compute_s, comm, accum * batch),
        "zero1": _point(n, compute_s, zero, batch),
    }
    rows.append(row)
  return rows


def gradient_bytes(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """What one step all-reduces (tensor bytes, operands, instructions): compiled for 2 devices where there are two,
  else the parameters' leaves (XLA drops a 1-device all-reduce)."""
  trial = config_lib.with_defaults(config)
  two = jax.device_count() >= 2
  trial.parallel.num_devices = 2 if two else 1
  trial.batch_size = trial.eval_batch_size = trial.batch_size * trial.parallel.num_devices
  parts = build.build(trial)
  abstract = jax.eval_shape(parts.init)
  ops = []
  if two:
    compiled = parts.train_step.lower(*hlo.abstract_inputs(parts, abstract)).compile()
    ops = [op for op in hlo.parse_compiled(compiled.as_text() or "", 2)[0] if op["kind"] == "all-reduce"]
  tensors = [dims for op in ops for _, dims in op["shapes"] if dims]
  if tensors:
    return {"bytes": hlo.tally(ops)["all-reduce"]["tensor_bytes"], "tensors": len(tensors),
            "instructions": len(ops), "source": "compiled HLO on 2 devices"}
  leaves = jax.tree.leaves(abstract.params)
  scale = 0.5 if trial.parallel.allreduce_dtype == "bfloat16" else 1.0
  return {"bytes": int(summary.tree_bytes(abstract.params) * scale), "tensors": len(leaves), "instructions": 1,
          "source": "parameter bytes (1 device: no all-reduce in the compiled step)"}


def compute_seconds(config: ml_collections.ConfigDict, warmup: int = 3, steps: int = 10) -> float:
  """Median time of the real train step on 1 device with the config's batch (random data), after warm-up."""
  trial = config.copy_and_resolve_references()
  trial.parallel.num_devices = 1
  parts = build.build(trial)
  state = parts.backend.init(parts.init)
  batch = parts.backend.put_step(hlo.fake_batch(hlo.batch_shapes(parts.ds, parts.layout.global_batch)))
  times = []
  for i in range(warmup + steps):
    start = time.perf_counter()
    state, metrics = parts.train_step(state, batch)
    jax.block_until_ready((state, metrics))
    if i >= warmup:
      times.append(time.perf_counter() - start)
  return statistics.median(times)


def project(config: ml_collections.ConfigDict, counts: list[int], name: str = DEFAULT_INTERCONNECT,
            compute_s: float | None = None) -> dict[str, Any]:
  """The projection for `counts` devices on interconnect `name` (compute measured here unless given)."""
  link = interconnect(name)
  grads = gradient_bytes(config)
  # gloo (XLA:CPU) runs every tensor operand of an all-reduce as its own call (a flat buffer: one);
  # NCCL and TPU run each instruction as one.
  calls = grads["tensors"] if link.per_operand else grads["instructions"]
  compute_s = compute_seconds(config) if compute_s is None else compute_s
  batch = config.batch_size
  return {"interconnect": name, "bytes_per_s": link.bytes_per_s, "latency_s": link.latency_s,
          "interconnect_source": link.source, "per_device_batch": batch, "compute_s": compute_s,
          "compute_per_example_s": compute_s / batch, "device_kind": jax.devices()[0].device_kind,
          "gradient_bytes": grads["bytes"], "gradient_source": grads["source"], "allreduce_calls": calls,
          "grad_accum_what_if": ACCUM,
          "rows": model(counts, compute_s, batch, grads["bytes"], calls, link)}


def format_report(r: dict[str, Any]) -> str:
  """The projection as aligned text."""
  size = units.binary_bytes
  lines = [
      f"jaxdp inspect --project: weak scaling, {r['per_device_batch']} examples per device per step, on "
      f"{r['interconnect']} ({r['bytes_per_s'] / 1e9:.3g} GB/s, {r['latency_s'] * 1e6:.3g} us per message)",
      f"  compute     {r['compute_s'] * 1e3:.3g} ms per step measured on 1 x {r['device_kind']} "
      f"({r['compute_per_example_s'] * 1e6:.3g} us per example)",
      f"  gradients   {size(r['gradient_bytes'])} all-reduced per step in {r['allreduce_calls']} call(s) "
      f"({r['gradient_source']})", "",
      f"  {'N':>6}{'step ms':>10}{'samples/s':>12}{'efficiency':>11}{'comm':>7}  algo"
      f"{'bf16 eff':>10}{'accum ' + str(r['grad_accum_what_if']) + ' eff':>13}{'ZeRO-1 eff':>12}",
  ]
  for row in r["rows"]:
    w = row["what_if"]
    lines.append(f"  {row['devices']:>6}{row['step_s'] * 1e3:>10.3g}{row['samples_per_s']:>12,.0f}"
                 f"{row['efficiency']:>10.1%}{row['comm_share']:>7.0%}  {row['algorithm']:<4}"
                 f"{w['bf16_allreduce']['efficiency']:>10.1%}"
                 f"{w['grad_accum_' + str(r['grad_accum_what_if'])]['efficiency']:>13.1%}"
                 f"{w['zero1']['efficiency']:>12.1%}")
  lines += ["", "  efficiency = compute / step (1 device = 100%); comm = the all-reduce's share of the step; what-ifs:",
            "  bf16 all-reduce (half the bytes), gradient accumulation (one all-reduce per k micro-batches),",
            "  ZeRO-1 (ring reduce-scatter + all-gather: a ring all-reduce's bytes and latency rounds, never a tree)."]
  return "\n".join(lines)

