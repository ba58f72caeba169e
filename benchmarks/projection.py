"""The scaling projection, an alpha-beta model of one data-parallel step on N devices, and its check against real
multi-process runs.

    python benchmarks/projection.py --project 8,64,512 [--interconnect NAME] [--json] --config C.py [--config.K=V]
    python benchmarks/projection.py [--processes 1,2,4] [--batch 128] [--steps 80] [--rounds 3] [--config C.py]

`--project COUNTS`: step(N) = compute (the real step timed on one device here) + the all-reduce of the gradient
bytes the compiled step sends, on a named interconnect; weak scaling. The model and what it leaves out:
benchmarks/README.md#scaling-projection.

Without it, the model against real runs: 1, 2 and 4 gloo processes on this machine, weak scaling (every process,
1 CPU device each, keeps `--batch` examples per step; the global batch is P x batch). Measured: `python -m
jaxdp.launch --num_processes P --devices_per_process 1` trains the config for `--steps` steps; the step time is the
median `perf/step_time` of metrics.jsonl after the first quarter (warm-up and compilation). Projected: `--project P
--interconnect gloo-localhost` with the compute time measured with P processes sharing the cores, as the real run
shares them: P concurrent independent 1-device trainings, without communicating; the median of theirs.
Writes projection.md (command, date, machine, load, table) and projection.png next to this file.
"""

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
import ml_collections
from matplotlib.figure import Figure

from jaxdp import build
from jaxdp import config as config_lib
from jaxdp.config import ConfigError
from jaxdp.report import summary, units
from jaxdp.tools import cli, hlo, topology

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
USAGE = ("python benchmarks/projection.py --project 8,64,512 [--interconnect NAME] [--json] --config CONFIG.py "
         "[--config.key=value ...] [--cpu_devices N]")


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


def ring_allreduce_s(n: int, nbytes: float, link: Interconnect, calls: int = 1) -> float:
  """Ring: each device sends and receives 2 (n-1)/n of the buffer, in 2 (n-1) latency-bound rounds per call."""
  return topology.ring_share("all-reduce", n) * nbytes / link.bytes_per_s + calls * 2 * (n - 1) * link.latency_s


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
      f"projection: weak scaling, {r['per_device_batch']} examples per device per step, on "
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


def overrides(batch: int, steps: int) -> list[str]:
  """Training flags: the per-process batch, no checkpoints, one evaluation at the end, logs every 5 steps."""
  return [f"--config.num_train_steps={steps}", "--config.log_every_steps=5", f"--config.eval_every_steps={steps}",
          "--config.checkpoint_every_steps=0",
          f"--config.batch_size={batch}"]


def measured(config: str, processes: int, batch: int, steps: int) -> float:
  """Median steady-state step time (s) of a real run of `processes` gloo processes."""
  with tempfile.TemporaryDirectory() as workdir:
    cmd = [sys.executable, "-m", "jaxdp.launch", "--num_processes", str(processes), "--devices_per_process", "1",
           "--", "--config", config, "--workdir", workdir, *overrides(processes * batch, steps)]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, timeout=900)
    return steady_step_time(workdir, steps)


def compute_shared(config: str, processes: int, batch: int, steps: int) -> float:
  """Step time without communication, cores shared as in the real run: `processes` concurrent independent
  1-process, 1-device trainings (`python -m jaxdp.train --cpu_devices 1`); the median of their medians."""
  with tempfile.TemporaryDirectory() as root:
    workdirs = [os.path.join(root, str(i)) for i in range(processes)]
    procs = [subprocess.Popen([sys.executable, "-m", "jaxdp.train", "--config", config, "--workdir", w,
                               "--cpu_devices", "1", *overrides(batch, steps)], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for w in workdirs]
    for p in procs:
      if p.wait(timeout=900):
        raise RuntimeError(f"an independent training failed: {p.args}")
    return statistics.median(steady_step_time(w, steps) for w in workdirs)


def steady_step_time(workdir: str, steps: int) -> float:
  """Median `perf/step_time` of metrics.jsonl after the first quarter of the run (compilation, warm-up)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return statistics.median(r["perf/step_time"] for r in rows if "perf/step_time" in r and r["step"] > steps // 4)


def projected(config: str, batch: int, *flags: str) -> dict:
  """This script's `--project ...` report as JSON, from a fresh process (its own simulated CPU devices)."""
  out = subprocess.run([sys.executable, __file__, *flags, "--json", "--config", config, *overrides(batch, 1)],
                       cwd=ROOT, check=True, capture_output=True, text=True).stdout
  return json.loads(out)


def draw(results: list[dict], path: str) -> None:
  """Step time against processes: measured, projected, and the projection's compute part."""
  fig = Figure(figsize=(6, 4), layout="constrained")
  ax = fig.subplots()
  ps = [r["processes"] for r in results]
  ax.plot(ps, [1e3 * r["measured_s"] for r in results], "o-", label="measured (jaxdp.launch, gloo)")
  ax.plot(ps, [1e3 * r["projected_s"] for r in results], "s--", label="projected (alpha-beta, gloo-localhost)")
  ax.plot(ps, [1e3 * r["compute_s"] for r in results], "^:", label="projected: its compute part")
  ax.plot(ps, [1e3 * r["shared_s"] for r in results], "d-.", label="projected, cores split evenly")
  ax.set(xlabel="processes (1 CPU device each)", ylabel="step time, ms", title="Projection vs measured, weak scaling",
         xticks=ps)
  ax.set_ylim(bottom=0)
  ax.legend(fontsize="small")
  fig.savefig(path, dpi=110)


def check(argv: list[str]) -> None:
  """The projection against real runs of 1, 2 and 4 gloo processes; writes the table and the figure."""
  os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"  # Every run and probe compiles, as a first run does.
  parser = argparse.ArgumentParser()
  parser.add_argument("--processes", default="1,2,4")
  parser.add_argument("--batch", type=int, default=128)  # Per process.
  parser.add_argument("--steps", type=int, default=80)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--config", default="jaxdp/configs/default.py")
  parser.add_argument("--out", default=os.path.join(HERE, "projection.md"))
  args = parser.parse_args(argv)
  load_before = abrun.load()
  alone = projected(args.config, args.batch, "--project", "1", "--cpu_devices", "1")["compute_s"]
  counts = [int(x) for x in args.processes.split(",")]
  compute, real = {p: [] for p in counts}, {p: [] for p in counts}
  for _ in range(args.rounds):  # Rounds alternate the two runs of each P: the other jobs' load moves both alike.
    for p in counts:
      compute[p].append(compute_shared(args.config, p, args.batch, args.steps))
      real[p].append(measured(args.config, p, args.batch, args.steps))
      print(json.dumps({"processes": p, "compute_s": compute[p][-1], "measured_s": real[p][-1]}), flush=True)
  results = []
  for p in counts:
    compute_s = statistics.median(compute[p])
    r = projected(args.config, args.batch, "--project", str(p), "--interconnect", "gloo-localhost",
                  "--compute_s", repr(compute_s), "--cpu_devices", "2")  # Gradients compiled for 2 devices.
    row = r["rows"][0]
    results.append({"processes": p, "compute_s": compute_s, "projected_s": row["step_s"], "comm_s": row["comm_s"],
                    "algorithm": row["algorithm"], "measured_s": statistics.median(real[p]), "report": r,
                    "compute_runs": compute[p], "measured_runs": real[p]})
    results[-1]["shared_s"] = results[0]["compute_s"] * max(1.0, p / os.cpu_count()) + row["comm_s"]

  png = os.path.splitext(args.out)[0] + ".png"
  draw(results, png)
  first = results[0]["report"]
  lines = abrun.header("Scaling projection vs measured: 1, 2, 4 gloo processes", load_before,
                       "P processes x 1 CPU device, gloo collectives over localhost, sharing the cores")
  lines += [f"Config `{args.config}`, weak scaling: {args.batch} examples per process per step (global batch P x "
            f"{args.batch}), {args.steps} steps. Gradients {first['gradient_bytes']:,} bytes in "
            f"{first['allreduce_calls']} all-reduce call(s) ({first['gradient_source']}). Interconnect "
            f"`gloo-localhost`: alpha {first['latency_s'] * 1e6:.0f} us, {first['bytes_per_s'] / 1e9:.2f} GB/s "
            "(`INTERCONNECTS` here). Compute: the step time of P concurrent independent "
            "1-device trainings (`jaxdp.train --cpu_devices 1`, no communication), so that the cores are shared "
            "as in the real run (4 processes oversubscribe 2 cores) and the input pipeline is counted. Measured and "
            "compute: median `perf/step_time` after the first quarter of the run; "
            f"{args.rounds} rounds alternating the two, the median of the rounds (each round's figures below).", "",
            f"The train step alone (what `--project` times: device-resident batch, 1 process) took "
            f"{1e3 * alone:.2f} ms; the 1-process training loop's step {1e3 * results[0]['compute_s']:.2f} ms (the "
            "loop adds its input pipeline and host work, and overlaps some of it with 2 steps in flight): `--project`"
            " leaves that difference out.", "",
            "Second model, `cores shared`: compute = the 1-process step x max(1, P / cores), as if the processes "
            f"split the {os.cpu_count()} cores evenly, plus the same all-reduce model.", "",
            "| processes | compute ms (concurrent trainings) | all-reduce ms (model) | projected step ms "
            "| measured step ms | projected / measured | cores-shared projection ms | its / measured |",
            "| --- " * 8 + "|"]
  for r in results:
    lines.append(f"| {r['processes']} | {1e3 * r['compute_s']:.2f} | {1e3 * r['comm_s']:.2f} ({r['algorithm']}) | "
                 f"{1e3 * r['projected_s']:.2f} | {1e3 * r['measured_s']:.2f} | "
                 f"{r['projected_s'] / r['measured_s']:.2f} | {1e3 * r['shared_s']:.2f} | "
                 f"{r['shared_s'] / r['measured_s']:.2f} |")
  lines += ["", "Each round, ms (compute / measured): " + "; ".join(
      f"P = {r['processes']}: " + ", ".join(f"{1e3 * c:.1f} / {1e3 * m:.1f}" for c, m in
                                            zip(r["compute_runs"], r["measured_runs"])) for r in results)]
  lines += ["", f"![projection vs measured]({os.path.basename(png)})"]
  abrun.write(args.out, lines)


def split_flags(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
  """`--project`'s own flags, checked (the counts parsed), and `argv` without them (for `cli.parse`)."""
  parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
  for flag in ("--project", "--interconnect"):  # nargs="?": a flag given without its value is named.
    parser.add_argument(flag, nargs="?", const="")
  parser.add_argument("--compute_s", type=float)  # Given: no step is timed (the check's concurrent trainings).
  parser.add_argument("--json", action="store_true")
  ours, rest = cli.own_flags(argv, parser)
  ours.project = None if ours.project is None else parse_counts(ours.project)
  if ours.interconnect is not None:
    interconnect(ours.interconnect)  # An unknown name first: its error lists the known ones.
    if ours.project is None:
      raise ConfigError("--interconnect goes with --project COUNTS (e.g. --project 8,64,512)")
  ours.interconnect = ours.interconnect or DEFAULT_INTERCONNECT
  return ours, rest


def _project_command(argv: list[str]) -> None:
  """Parses `argv`, projects and prints the report (as JSON with --json)."""
  ours, argv = split_flags(argv)
  config, _ = cli.parse(argv, require_workdir=False, usage=USAGE,
                        extra_help="  --project 8,64,512: the device counts.\n  --interconnect NAME: one of "
                        f"{', '.join(INTERCONNECTS)} (default {DEFAULT_INTERCONNECT}).\n  --json: the report as JSON.")
  with contextlib.redirect_stdout(sys.stderr):  # Dataset preparation messages must not mix into the report.
    report = project(config, ours.project, ours.interconnect, ours.compute_s)
  print(json.dumps(report, indent=2) if ours.json else format_report(report))


def main(argv: list[str]) -> int:
  """`--project` (or `--interconnect`): the projection, one `error:` line and 2 for a mistake; else the check."""
  if any(a.split("=")[0] in ("--project", "--interconnect") for a in argv[1:]):
    return cli.guarded(lambda: _project_command(argv))
  check(argv[1:])
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
