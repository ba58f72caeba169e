"""Python's garbage collector inside the training loop: automatic (`collector.EVERY_STEPS = 0`, set in the child)
against jaxdp's collection every N steps (`jaxdp.loop.collector`), on the default run (digits CNN, 8 simulated devices).

    python experiments/gc_in_loop.py [--rounds 3] [--every 50] [--devices 8] [--out experiments/gc_in_loop.md]

Each round runs both contenders in turn (A B A B), each a fresh `python -m jaxdp.train` of configs/default.py
with gc.callbacks counting every collection from the loop's start (where the loop enters its Collector,
with or without N) to the end, by generation, with its CPU time (`time.thread_time` of the collecting thread: waits cost none, so the
figure holds on a loaded machine). Reports per contender: the collections and their CPU ms, `time/input`'s share
of the wall (goodput.json), and samples/s (the median of metrics.jsonl's `perf/examples_per_second` after the first log step).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run inside each child: counts the collections from the loop's start on, then runs the CLI.
PROBE = r"""
import atexit, gc, json, runpy, sys, threading, time
from jaxdp.loop import collector
seen, started, in_loop = [], {}, [False]
def note(phase, info):
  key = threading.get_ident()
  if phase == "start":
    started[key] = time.thread_time()
  elif in_loop[0] and key in started:
    seen.append((info["generation"], time.thread_time() - started.pop(key)))
gc.callbacks.append(note)
enter = collector.Collector.__enter__
def loop_on(self):
  in_loop[0] = True
  return enter(self)
collector.Collector.__enter__ = loop_on
out = sys.argv.pop(1)
collector.EVERY_STEPS = int(sys.argv.pop(1))
atexit.register(lambda: json.dump(seen, open(out, "w")))
sys.argv[0] = "jaxdp.train"
runpy.run_module("jaxdp.train", run_name="__main__")
"""


def run(every: int, devices: int, tmp: str, name: str) -> dict:
  """One fresh default run: its collections in the loop, input share, samples/s."""
  workdir, seen = os.path.join(tmp, name), os.path.join(tmp, name + ".gc.json")
  cmd = [sys.executable, "-c", PROBE, seen, str(every), "--config", "jaxdp/configs/default.py", "--workdir", workdir,
         "--cpu_devices", str(devices), "--config.compilation_cache_dir="]
  subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
  seconds = json.load(open(os.path.join(workdir, "goodput.json")))["seconds"]
  collections = json.load(open(seen))
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  return {"every": every, "input_share": seconds["input"] / seconds["wall"], "input_s": seconds["input"],
          "train_s": seconds["train"], "wall_s": seconds["wall"], "samples_per_s": steady_rate(records),
          "collections": {g: sum(1 for c in collections if c[0] == g) for g in range(3)},
          "gc_cpu_ms": {g: 1e3 * sum(c[1] for c in collections if c[0] == g) for g in range(3)}}


def steady_rate(records: list[dict]) -> float:
  """Samples/s over the logged steps after the first log step (its window holds the compile)."""
  rates = [r["perf/examples_per_second"] for r in records if "perf/examples_per_second" in r][1:]
  return statistics.median(rates) if rates else float("nan")


def report(runs: list[dict], args: argparse.Namespace, load_before: float) -> list[str]:
  """The markdown table, one row per contender: medians (min..max) over rounds."""
  lines = abrun.header("Python's garbage collector in the training loop: automatic vs every N steps", load_before,
                       f"{args.devices} simulated CPU devices")
  lines += ["| collector.EVERY_STEPS | collections in the loop (gen 0/1/2) | their CPU ms (gen 0/1/2) | time/input share "
            "of wall | samples/s |", "| --- | --- | --- | --- | --- |"]
  for every in (0, args.every):
    mine = [r for r in runs if r["every"] == every]
    counts = "/".join(f"{statistics.median(r['collections'][g] for r in mine):g}" for g in range(3))
    cpu = "/".join(f"{statistics.median(r['gc_cpu_ms'][g] for r in mine):.1f}" for g in range(3))
    share = [100 * r["input_share"] for r in mine]
    lines.append(f"| {every} | {counts} | {cpu} | {abrun.fmt(share, 2)} % | "
                 f"{abrun.fmt_rate([r['samples_per_s'] for r in mine])} |")
  ratios = abrun.ratios([r["samples_per_s"] for r in runs if r["every"]],
                        [r["samples_per_s"] for r in runs if not r["every"]])
  lines += ["", f"samples/s, every {args.every} / automatic, per round: {', '.join(f'{x:.3f}' for x in ratios)} "
            f"(median {abrun.fmt(ratios)})."]
  return lines


def main(argv: list[str]) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--every", type=int, default=50, help="The contender's collector.EVERY_STEPS.")
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  load_before, runs = abrun.load(), []
  with tempfile.TemporaryDirectory(prefix="gc_in_loop_") as tmp:
    for r in range(args.rounds):
      for every in (0, args.every):
        runs.append(run(every, args.devices, tmp, f"every{every}_{r}"))
        print(json.dumps(runs[-1]), flush=True)
  abrun.write(args.out, report(runs, args, load_before))
  return runs


if __name__ == "__main__":
  main(sys.argv[1:])
