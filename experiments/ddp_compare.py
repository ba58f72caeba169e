"""jaxdp and PyTorch DDP side by side on CPU: 2 workers on 127.0.0.1 over gloo, and 1 worker each.

    python experiments/ddp_compare.py [--configs mlp:256,mlp:1024,cnn:256,cnn:1024] [--rounds 5] \
        [--seconds 2] [--out experiments/ddp_compare.md]

Needs the `bench` extra (torch). Starts four groups of long-lived worker processes: jaxdp with 2
processes (ddp_jaxdp_worker.py: jaxdp's mesh backend and train step, joined through jax.distributed
with the environment jaxdp.launch sets, gloo collectives), PyTorch DDP with 2 processes
(ddp_torch_worker.py: DistributedDataParallel, gloo), and one process of each. Rank r is pinned to core
r with `taskset -c r` and runs one thread (XLA: --xla_cpu_multi_thread_eigen=false; torch:
set_num_threads(1)). Same models (ddp_common.MODELS), Adam, float32, the same synthetic global batch
resident in memory, so only the train step is timed.

Each round, for every (model, global batch), runs the groups one after the other, jaxdp then PyTorch
(A B A B ...), each for a step count fixed at warm-up to take about `--seconds`, then times the gradient
all-reduce alone (the same bytes) in both 2-process groups. Throughput = global batch / per-round median
step time; every ratio is jaxdp / PyTorch within a round (> 1: jaxdp faster), as median (min..max):
  overall    2-worker samples/s ratio;
  compute    1-worker samples/s ratio (no communication);
  all-reduce all-reduce time ratio PyTorch / jaxdp of the model's gradient bytes.
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

from jaxdp import cpu_devices, distributed, launch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


class Group:
  """W worker processes of one framework, pinned one per core, driven through stdin/stdout."""

  def __init__(self, framework: str, world: int, xla_flags: str = ""):
    self.name = f"{framework}x{world}"
    port = launch.free_port()
    script = os.path.join(HERE, f"ddp_{framework}_worker.py")
    self.logs = [os.path.join(tempfile.gettempdir(), f"ddp_compare_{self.name}_{rank}.log") for rank in range(world)]
    self.procs = [subprocess.Popen(_pin(rank) + [sys.executable, script], env=_env(framework, rank, world, port, xla_flags),
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


def measure(groups: dict[str, Group], configs: list[tuple[str, int]], rounds: int, seconds: float,
            warmup: int) -> dict:
  """Per-round median step times (and all-reduce times), the groups alternating within each round."""
  counts = {}
  for model, batch in configs:
    for name, group in groups.items():
      group.ask({"op": "train", "model": model, "batch": batch, "steps": warmup})
      t = np.median(group.ask({"op": "train", "model": model, "batch": batch, "steps": 2})["times"])
      counts[name, model, batch] = max(3, round(seconds / t))
  models = sorted({m for m, _ in configs})
  medians: dict = collections.defaultdict(list)
  nbytes = {}
  for _ in range(rounds):
    for model, batch in configs:
      for name, group in groups.items():
        times = group.ask({"op": "train", "model": model, "batch": batch, "steps": counts[name, model, batch]})["times"]
        medians[name, model, batch].append(float(np.median(times)))
    for model in models:
      for name in ("jaxdpx2", "torchx2"):
        answer = groups[name].ask({"op": "allreduce", "model": model, "steps": 10})
        medians[name, model, "allreduce"].append(float(np.median(answer["times"])))
        nbytes[name, model] = answer["bytes"]
  return {"medians": dict(medians), "counts": counts, "bytes": nbytes}


def ratios(r: dict, model: str, batch: int) -> dict[str, list[float]]:
  """Per-round jaxdp / PyTorch ratios (> 1: jaxdp faster)."""
  m = r["medians"]
  return {"overall": abrun.ratios(m["torchx2", model, batch], m["jaxdpx2", model, batch]),
          "compute": abrun.ratios(m["torchx1", model, batch], m["jaxdpx1", model, batch]),
          "allreduce": abrun.ratios(m["torchx2", model, "allreduce"], m["jaxdpx2", model, "allreduce"])}


def report(r: dict, configs: list[tuple[str, int]], args: argparse.Namespace, png: str, load_before: float,
           versions: str) -> list[str]:
  """Markdown: header, the throughput table, the ratio table, the all-reduce table, the PNG."""
  m = r["medians"]
  lines = abrun.header("jaxdp vs PyTorch DDP on CPU (gloo, 127.0.0.1, one core and one thread per worker)",
                       load_before, f"CPU; {versions}")
  lines += [f"{args.rounds} rounds; in each, every (model, global batch) runs jaxdp x2, PyTorch x2, jaxdp x1, "
            f"PyTorch x1 in turn, each for about {args.seconds:g} s (a step count fixed at warm-up), then the "
            "all-reduce alone in both 2-worker groups. Samples/s = global batch / the round's median step "
            "time; ratios are jaxdp / PyTorch per round (> 1: jaxdp faster), median (min..max) over rounds.", "",
            "| model | global batch | jaxdp 2w samples/s | DDP 2w samples/s | **ratio 2w** | jaxdp 1w samples/s | "
            "torch 1w samples/s | compute ratio (1w) | all-reduce ratio (same bytes) |",
            "| --- " * 9 + "|"]
  for model, batch in configs:
    sps = {g: [batch / t for t in m[g, model, batch]] for g in ("jaxdpx2", "torchx2", "jaxdpx1", "torchx1")}
    q = ratios(r, model, batch)
    lines.append(f"| {model} | {batch} | {abrun.fmt(sps['jaxdpx2'])} | {abrun.fmt(sps['torchx2'])} | "
                 f"**{abrun.fmt(q['overall'])}** | {abrun.fmt(sps['jaxdpx1'])} | {abrun.fmt(sps['torchx1'])} | "
                 f"{abrun.fmt(q['compute'])} | {abrun.fmt(q['allreduce'])} |")
  lines += ["", "All-reduce of the gradient bytes alone (2 workers; jaxdp: `step.all_reduce_mean` of the gradient "
            "tree, as in its step; PyTorch: `dist.all_reduce` of one flat buffer, as one DDP bucket):", "",
            "| model | bytes | jaxdp ms | PyTorch ms |", "| --- | --- | --- | --- |"]
  for model in sorted({mm for mm, _ in configs}):
    lines.append(f"| {model} | {r['bytes']['jaxdpx2', model]:,} | {abrun.fmt_ms(m['jaxdpx2', model, 'allreduce'])} | "
                 f"{abrun.fmt_ms(m['torchx2', model, 'allreduce'])} |")
  lines += ["", f"![ratios]({os.path.basename(png)})"]
  return lines


def draw(r: dict, configs: list[tuple[str, int]], path: str) -> None:
  """Bars of the three ratios per (model, batch), whiskers min..max, a line at 1."""
  fig = Figure(figsize=(9, 4), layout="constrained")
  ax = fig.subplots()
  kinds = ("overall", "compute", "allreduce")
  for i, (model, batch) in enumerate(configs):
    q = ratios(r, model, batch)
    for j, kind in enumerate(kinds):
      s = abrun.spread(q[kind])
      ax.bar(i + (j - 1) * 0.27, s["median"], 0.25, color=f"C{j}", label=kind if i == 0 else None,
             yerr=[[s["median"] - s["min"]], [s["max"] - s["median"]]], capsize=3)
  ax.axhline(1.0, color="k", lw=0.8)
  ax.set_xticks(range(len(configs)), [f"{m} {b}" for m, b in configs])
  ax.set(ylabel="jaxdp / PyTorch (speed; > 1: jaxdp faster)", title="jaxdp vs PyTorch DDP, CPU, gloo, 1 thread/worker")
  ax.legend(["2 workers", "compute (1 worker)", "all-reduce (same bytes)"])
  fig.savefig(path, dpi=100)


def _versions() -> str:
  out = subprocess.run([sys.executable, "-c", "import jax, torch; print(f'jax {jax.__version__}, torch {torch.__version__}')"],
                       capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  return out.stdout.strip() or "versions unknown"


def main(argv: list[str]) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--configs", default="mlp:256,mlp:1024,cnn:256,cnn:1024", help="model:global_batch, comma-separated")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--seconds", type=float, default=2.0, help="about this long per group, config and round")
  p.add_argument("--warmup", type=int, default=3, help="untimed steps per group and config (compilation)")
  p.add_argument("--xla_flags", default="", help="extra XLA_FLAGS for the jaxdp workers")
  p.add_argument("--out", default=os.path.join(HERE, "ddp_compare.md"))
  args = p.parse_args(argv)
  configs = [(c.split(":")[0], int(c.split(":")[1])) for c in args.configs.split(",")]
  load_before = abrun.load()
  groups = {}
  try:
    for framework, world in (("jaxdp", 2), ("torch", 2), ("jaxdp", 1), ("torch", 1)):
      groups[f"{framework}x{world}"] = Group(framework, world, args.xla_flags)
    started = time.perf_counter()
    results = measure(groups, configs, args.rounds, args.seconds, args.warmup)
    print(f"measured in {time.perf_counter() - started:.0f} s", file=sys.stderr)
  finally:
    for g in groups.values():
      g.close()
  png = os.path.splitext(args.out)[0] + ".png"
  draw(results, configs, png)
  abrun.write(args.out, report(results, configs, args, png, load_before, _versions()))


if __name__ == "__main__":
  main(sys.argv[1:])
