"""jaxdp and PyTorch DDP side by side on CPU: 2 workers on 127.0.0.1 over gloo, and 1 worker each.

    python experiments/ddp_compare.py [--configs mlp:256,mlp:1024,cnn:256,cnn:1024] [--rounds 4] \
        [--seconds 1] [--out experiments/ddp_compare.md]

Needs the `bench` extra (torch). Starts groups of long-lived worker processes: jaxdp with 2 processes
(ddp_jaxdp_worker.py: jaxdp's mesh backend and train step, joined through jaxdp.distributed with the
environment jaxdp.launch sets, gloo collectives), PyTorch DDP with 2 processes (ddp_torch_worker.py:
DistributedDataParallel, gloo), one process of each, and one jaxdp process with XLA's default flags.
Rank r is pinned to core r with `taskset -c r` and runs one thread (XLA: --xla_cpu_multi_thread_eigen=
false; torch: set_num_threads(1)). Same models (ddp_common.MODELS), Adam, float32, the same synthetic
global batch resident in memory, so only the train step is timed.

Each round, for every (model, global batch), runs the contenders (TRAIN) one after the other, jaxdp and
PyTorch in turn (A B A B ...), each for a step count fixed at warm-up to take about `--seconds`, then
times the gradient all-reduce alone (the same bytes) in both 2-process groups. Samples/s = global batch
/ per-round median step time; every ratio is PyTorch time / jaxdp time within a round (> 1: jaxdp
faster), as median [interquartile range] over rounds:
  2 workers            the overall comparison;
  compute (1 worker)   no communication;
  all-reduce           the model's gradient bytes, each framework's way;
  2 workers, no all-reduce   both steps without their collective (DDP's `no_sync()`; jaxdp's step with none,
                       experiments/step_variants.py): the compute of the 2-worker step;
plus what XLA's default flags give, and for each framework the step's time over its time without the
all-reduce: what the all-reduce adds to the step (DDP overlaps its buckets with the backward pass).
"""

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from matplotlib.figure import Figure

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402
import ddp_common  # noqa: E402

from jaxdp.runtime import cpu_devices, distributed  # noqa: E402
from jaxdp.tools import launch

HERE = os.path.dirname(os.path.abspath(__file__))
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
# One thread for XLA:CPU's Eigen kernels. Not the often-quoted "intra_op_parallelism_threads=1": that is no
# XLA flag, and XLA's parser silently ignores every flag after such a bare word.
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"
# XLA:CPU runs convolutions through YNNPACK by default; its weight-gradient convolutions are slower here than
# XLA's own (2.1x and 1.2x on the CNN's two in conv_parts.md; 143 vs 53 ms in an earlier measurement), and the
# whole step is 1.2-1.3x faster without them.
TUNED_XLA_FLAGS = "--xla_cpu_experimental_ynn_fusion_type=-individual_convolution"


class Group:
  """W worker processes of one framework, pinned one per core, driven through stdin/stdout."""

  def __init__(self, framework: str, world: int, xla_flags: str = ""):
    self.name = f"{framework}x{world}"
    port = launch.free_port()
    script = os.path.join(HERE, f"ddp_{framework}_worker.py")
    self.logs = [os.path.join(tempfile.gettempdir(), f"ddp_compare_{self.name}_{rank}.log") for rank in range(world)]
    self.procs = [subprocess.Popen(_pin(rank) + [sys.executable, script],
                                   env=_env(framework, rank, world, port, xla_flags),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(self.logs[rank], "w"),
                                   text=True) for rank in range(world)]
    self._replies()  # {"ready": true} once every rank has joined.

  def ask(self, command: dict) -> dict:
    """Sends `command` to every rank; returns rank 0's answer once all have answered."""
    for p in self.procs:
      p.stdin.write(json.dumps(command) + "\n")
      p.stdin.flush()
    return self._replies()[0]

  def _replies(self) -> list[dict]:
    out = []
    for rank, p in enumerate(self.procs):
      while True:
        line = p.stdout.readline()
        if not line:
          raise RuntimeError(f"{self.name} rank {rank} exited with status {p.wait()}; its stderr: {self.logs[rank]}")
        if line.startswith(ddp_common.MARK):
          out.append(json.loads(line[len(ddp_common.MARK):]))
          break
    return out

  def close(self) -> None:
    for p in self.procs:
      if p.poll() is None:
        p.stdin.write(json.dumps({"op": "quit"}) + "\n")
        p.stdin.close()
    for p in self.procs:
      try:
        p.wait(timeout=30)
      except subprocess.TimeoutExpired:
        p.kill()


def _pin(rank: int) -> list[str]:
  """`taskset -c RANK` (core RANK modulo the cores there are), when taskset exists."""
  return ["taskset", "-c", str(rank % os.cpu_count())] if shutil.which("taskset") else []


def _env(framework: str, rank: int, world: int, port: int, xla_flags: str) -> dict[str, str]:
  """The worker's environment: one thread; the launcher's variables (jaxdp) or torch.distributed's."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(ONE_THREAD)
  if framework == "torch":
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world)})
    return env
  env.update({"XLA_FLAGS": f"{XLA_ONE_THREAD} {xla_flags}".strip(), cpu_devices.ENV_VAR: "1", "JAX_PLATFORMS": "cpu"})
  if world > 1:  # As `python -m jaxdp.launch --num_processes W --devices_per_process 1` sets them.
    env.update({distributed.ENV_COORDINATOR: f"127.0.0.1:{port}", distributed.ENV_NUM_PROCESSES: str(world),
                distributed.ENV_PROCESS_ID: str(rank)})
  return env


# Train contenders: label -> (group, extra command fields). Alternated in this order every round.
TRAIN = {
    "jaxdp 2w": ("jaxdpx2", {}),
    "DDP 2w": ("torchx2", {}),
    "jaxdp 2w, no all-reduce": ("jaxdpx2", {"variant": "no_allreduce"}),
    "DDP 2w, no_sync": ("torchx2", {"variant": "no_sync"}),
    "jaxdp 1w": ("jaxdpx1", {}),
    "torch 1w": ("torchx1", {}),
    "jaxdp 1w XLA defaults": ("jaxdp_plainx1", {}),
}
ALLREDUCE = {"jaxdp": ("jaxdpx2", {}), "DDP": ("torchx2", {}), "jaxdp per leaf": ("jaxdpx2", {"per_leaf": True})}
# What the all-reduce adds to each framework's step: label -> (step, the same step without the all-reduce).
IN_STEP = {"jaxdp": ("jaxdp 2w", "jaxdp 2w, no all-reduce"), "DDP": ("DDP 2w", "DDP 2w, no_sync")}
# Ratios, PyTorch time / jaxdp time per round (> 1: jaxdp faster): name -> (PyTorch label, jaxdp label).
RATIOS = {
    "2 workers": ("DDP 2w", "jaxdp 2w"),
    "compute (1 worker)": ("torch 1w", "jaxdp 1w"),
    "all-reduce": ("DDP", "jaxdp"),
    "2 workers, no all-reduce": ("DDP 2w, no_sync", "jaxdp 2w, no all-reduce"),
    "compute, XLA defaults": ("torch 1w", "jaxdp 1w XLA defaults"),
    "all-reduce, one per leaf": ("DDP", "jaxdp per leaf"),
}


def measure(groups: dict[str, Group], configs: list[tuple[str, int]], rounds: int, seconds: float,
            warmup: int) -> dict:
  """Per-round median step (and all-reduce) times of every contender, alternating within each round."""
  counts = {}
  for model, batch in configs:
    for label, (group, extra) in TRAIN.items():
      command = {"op": "train", "model": model, "batch": batch, **extra}
      groups[group].ask({**command, "steps": warmup})
      t = np.median(groups[group].ask({**command, "steps": 2})["times"])
      counts[label, model, batch] = max(2, round(seconds / t))
  medians: dict = collections.defaultdict(list)
  nbytes = {}
  for _ in range(rounds):
    for model, batch in configs:
      for label, (group, extra) in TRAIN.items():
        command = {"op": "train", "model": model, "batch": batch, "steps": counts[label, model, batch], **extra}
        medians[label, model, batch].append(float(np.median(groups[group].ask(command)["times"])))
    for model in sorted({m for m, _ in configs}):
      for label, (group, extra) in ALLREDUCE.items():
        answer = groups[group].ask({"op": "allreduce", "model": model, "steps": 10, **extra})
        medians[label, model, "allreduce"].append(float(np.median(answer["times"])))
        nbytes[model] = answer["bytes"]
  return {"medians": dict(medians), "counts": counts, "bytes": nbytes}


def ratios(r: dict, model: str, batch: int) -> dict[str, list[float]]:
  """Per-round PyTorch / jaxdp time ratios (> 1: jaxdp faster)."""
  m = r["medians"]

  def key(label: str) -> tuple:
    return (label, model, "allreduce") if label in ALLREDUCE else (label, model, batch)

  return {name: abrun.ratios(m[key(torch)], m[key(jaxdp)]) for name, (torch, jaxdp) in RATIOS.items()}


def report(r: dict, configs: list[tuple[str, int]], args: argparse.Namespace, png: str, load_before: float,
           versions: str) -> list[str]:
  """Markdown: header, samples/s, the ratios, the all-reduce times, the PNG."""
  m = r["medians"]
  lines = abrun.header("jaxdp vs PyTorch DDP on CPU (gloo, 127.0.0.1, one core and one thread per worker)",
                       load_before, f"CPU; {versions}; jaxdp XLA_FLAGS `{XLA_ONE_THREAD} {args.xla_flags}`")
  lines += [f"{args.rounds} rounds; in each, every (model, global batch) runs the contenders below one after the "
            f"other, each for about {args.seconds:g} s (a step count fixed at warm-up), then the all-reduces "
            "alone. Samples/s = global batch / the round's median step time, shown as median [interquartile "
            "range] over rounds. `no all-reduce` / `no_sync`: the 2-worker steps without their collective "
            "(experiments/step_variants.py; DDP's `no_sync()`); `XLA defaults`: without the extra XLA flag.", "",
            "| model | batch | " + " | ".join(TRAIN) + " |", "| --- " * (2 + len(TRAIN)) + "|"]
  for model, batch in configs:
    lines.append(f"| {model} | {batch} | " + " | ".join(
        abrun.fmt_iqr([batch / t for t in m[label, model, batch]]) for label in TRAIN) + " |")
  lines += ["", "Ratios jaxdp / PyTorch in speed (PyTorch time / jaxdp time, per round; > 1: jaxdp faster):", "",
            "| model | batch | " + " | ".join(f"**{n}**" if i < 3 else n for i, n in enumerate(RATIOS)) + " |",
            "| --- " * (2 + len(RATIOS)) + "|"]
  for model, batch in configs:
    q = ratios(r, model, batch)
    lines.append(f"| {model} | {batch} | " + " | ".join(
        f"**{abrun.fmt_iqr(q[n])}**" if i < 3 else abrun.fmt_iqr(q[n]) for i, n in enumerate(RATIOS)) + " |")
  lines += ["", "All-reduce of the model's gradient bytes alone, 2 workers (jaxdp: the gradient tree as its step "
            "reduces it across processes, one flat buffer, `strategies.plain.flat_all_reduce_mean`; jaxdp per "
            "leaf: one collective per leaf, as its step did before; DDP: `dist.all_reduce` of one flat buffer, as "
            "one DDP bucket), ms:", "",
            "| model | bytes | " + " | ".join(ALLREDUCE) + " |", "| --- " * (2 + len(ALLREDUCE)) + "|"]
  for model in sorted({mm for mm, _ in configs}):
    lines.append(f"| {model} | {r['bytes'][model]:,} | " + " | ".join(
        abrun.fmt_ms(m[label, model, "allreduce"]) for label in ALLREDUCE) + " |")
  lines += ["", "What the all-reduce adds to each 2-worker step (step time / the same step's time without the "
            "all-reduce, per round; 1.00: hidden or free):", "",
            "| model | batch | " + " | ".join(IN_STEP) + " |", "| --- " * (2 + len(IN_STEP)) + "|"]
  for model, batch in configs:
    lines.append(f"| {model} | {batch} | " + " | ".join(
        abrun.fmt_iqr(abrun.ratios(m[a, model, batch], m[b, model, batch])) for a, b in IN_STEP.values()) + " |")
  lines += ["", f"![ratios]({os.path.basename(png)})"]
  return lines


def draw(r: dict, configs: list[tuple[str, int]], path: str) -> None:
  """Bars of the ratios per (model, batch), whiskers at the quartiles, a line at 1."""
  fig = Figure(figsize=(11, 5), layout="constrained")
  ax = fig.subplots()
  width = 0.8 / len(RATIOS)
  for i, (model, batch) in enumerate(configs):
    q = ratios(r, model, batch)
    for j, name in enumerate(RATIOS):
      s = abrun.spread(q[name])
      ax.bar(i + (j - (len(RATIOS) - 1) / 2) * width, s["median"], width * 0.9, color=f"C{j}",
             label=name if i == 0 else None, yerr=[[s["median"] - s["q1"]], [s["q3"] - s["median"]]], capsize=2)
  ax.axhline(1.0, color="k", lw=0.8)
  ax.set_xticks(range(len(configs)), [f"{m}, batch {b}" for m, b in configs])
  ax.set(ylabel="jaxdp / PyTorch speed (> 1: jaxdp faster)",
         title="jaxdp vs PyTorch DDP on CPU: gloo, 1 core and 1 thread per worker (whiskers: quartiles)")
  fig.legend(fontsize="small", ncol=3, loc="outside lower center")
  fig.savefig(path, dpi=100)


def _versions() -> str:
  code = "import jax, torch; print(f'jax {jax.__version__}, torch {torch.__version__}')"
  out = subprocess.run([sys.executable, "-c", code],
                       capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  return out.stdout.strip() or "versions unknown"


def main(argv: list[str]) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--configs", default="mlp:256,mlp:1024,cnn:256,cnn:1024", help="model:global_batch, comma-separated")
  p.add_argument("--rounds", type=int, default=4)
  p.add_argument("--seconds", type=float, default=1.0, help="about this long per group, config and round")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps per group and config (compilation)")
  p.add_argument("--xla_flags", default=TUNED_XLA_FLAGS, help="extra XLA_FLAGS for the jaxdp workers")
  p.add_argument("--out", default=os.path.join(HERE, "ddp_compare.md"))
  args = p.parse_args(argv)
  configs = [(c.split(":")[0], int(c.split(":")[1])) for c in args.configs.split(",")]
  load_before = abrun.load()
  groups = {}
  try:
    for framework, world in (("jaxdp", 2), ("torch", 2), ("jaxdp", 1), ("torch", 1)):
      groups[f"{framework}x{world}"] = Group(framework, world, args.xla_flags)
    groups["jaxdp_plainx1"] = Group("jaxdp", 1)
    started = time.perf_counter()
    results = measure(groups, configs, args.rounds, args.seconds, args.warmup)
    print(f"measured in {time.perf_counter() - started:.0f} s", file=sys.stderr)
  finally:
    for g in groups.values():
      g.close()
  png = os.path.splitext(args.out)[0] + ".png"
  with open(os.path.splitext(args.out)[0] + ".json", "w") as f:  # The raw per-round medians, for re-plotting.
    json.dump({"configs": configs, "medians": [[*k, v] for k, v in results["medians"].items()],
               "bytes": results["bytes"]}, f)
  draw(results, configs, png)
  abrun.write(args.out, report(results, configs, args, png, load_before, _versions()))


if __name__ == "__main__":
  main(sys.argv[1:])
