"""In-memory arrays, this tree against another: CPU ms per train step (all threads), steadier than wall time.

    python benchmarks/in_memory_cpu.py --before CHECKOUT [--rounds 8] [--steps 30] [--out in_memory.md]

The workload of input_pipeline.py's `memory` case, in one process per run: an MLP 784-1024-1024-10 (SGD) on
60,000 float32 rows, batch 1024, one device, through `DataParallel.batches` and `train_step`. Each run times
--steps steps after 5 untimed ones, by `time.process_time` (every thread of the process: the feeding thread's
gathers and XLA's work) and by the wall clock. The trees alternate (A B, B A, ...), a fresh process each; reported:
per tree the median (min..max) over rounds, and the per-round ratios this / before. On a machine shared with other
jobs the wall time moves with their load; the CPU time of the same work far less.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402

ROWS, FEATURES, BATCH, WARMUP = 60_000, 784, 1024, 5


def one_run(steps: int) -> dict[str, float]:
  """This process's run: CPU and wall ms per step over `steps` steps after WARMUP, and the feed's wait."""
  import jax
  import optax
  from flax import nnx

  import jaxdp

  class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      self.a, self.b = nnx.Linear(FEATURES, 1024, rngs=rngs), nnx.Linear(1024, 1024, rngs=rngs)
      self.c = nnx.Linear(1024, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
      return self.c(nnx.relu(self.b(nnx.relu(self.a(x)))))

  def classify(model: Net, batch: dict) -> tuple[jax.Array, dict]:
    logits = model(batch["inputs"])
    return (optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]),
            {"accuracy": logits.argmax(-1) == batch["labels"]})

  rng = np.random.default_rng(0)
  arrays = {"inputs": rng.standard_normal((ROWS, FEATURES), dtype=np.float32),
            "labels": rng.integers(0, 10, ROWS).astype(np.int32)}
  dp = jaxdp.DataParallel(num_devices=1)
  state, step = dp.init(Net, optax.sgd(0.01), seed=0), dp.train_step(classify)
  batches = dp.batches(arrays, batch_size=BATCH, stop_step=steps + WARMUP)
  for _ in range(WARMUP):
    state, metrics = step(state, next(batches))
  jax.block_until_ready(metrics)
  wall, cpu = time.perf_counter(), time.process_time()
  for _ in range(steps):
    state, metrics = step(state, next(batches))
  jax.block_until_ready(metrics)
  wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  return {"cpu_ms": 1000 * cpu / steps, "wall_ms": 1000 * wall / steps, "waited_s": batches.waited}


def measure(tree: str, steps: int) -> dict[str, float]:
  """One fresh process of `tree`'s jaxdp."""
  cmd = [sys.executable, os.path.abspath(__file__), "--one", "--steps", str(steps)]
  env = {**os.environ, "PYTHONPATH": tree, "JAX_PLATFORMS": "cpu"}
  out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
  if out.returncode:
    raise RuntimeError(f"{tree} failed ({out.returncode}):\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--before", default="", help="A checkout of jaxdp to alternate with (its jaxdp/ is run).")
  parser.add_argument("--rounds", type=int, default=8)
  parser.add_argument("--steps", type=int, default=30, help="Timed steps per run.")
  parser.add_argument("--out", default=None, help="Markdown results (also printed).")
  parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
  return parser.parse_args(argv)


def main(argv: list[str]) -> dict:
  args = parse(argv)
  if args.one:
    print(json.dumps(one_run(args.steps)))
    return {}
  trees = {"this": abrun.REPO, **({"before": os.path.abspath(args.before)} if args.before else {})}
  load_before = abrun.load()
  runs: dict[str, list[dict]] = {name: [] for name in trees}
  for r in range(args.rounds):
    for name in abrun.in_turn(list(trees), r):
      runs[name].append(measure(trees[name], args.steps))
  lines = abrun.header("In-memory arrays: CPU and wall ms per train step", load_before, "1 CPU device")
  lines += ["| code | CPU ms/step | wall ms/step | this / before, CPU | this / before, wall |", "|---|---|---|---|---|"]
  for name, rs in runs.items():
    vs = ["", ""]
    if name == "this" and "before" in runs:
      vs = [abrun.fmt(abrun.ratios([r[k] for r in rs], [r[k] for r in runs["before"]])) for k in ("cpu_ms", "wall_ms")]
    lines.append(f"| {name} | {abrun.fmt([r['cpu_ms'] for r in rs])} | {abrun.fmt([r['wall_ms'] for r in rs])} | "
                 f"{vs[0]} | {vs[1]} |")
  abrun.write(args.out, lines)
  return runs


if __name__ == "__main__":
  main(sys.argv[1:])
