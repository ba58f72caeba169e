"""A/B of a short run's start at two (or more) commits: goodput's setup and the command's whole wall, alternating.

    python experiments/startup_ab.py --commits before=36a5b47,after=HEAD --workloads cnn,mlp --procs 1,2 --rounds 4

What a user pays at every start and restart before the first step, measured on four_way's workloads and data
(four_way.py's commands), each run a fresh command and workdir; one untimed run per commit first, so that every
timed run finds the dataset prepared and its decoded split on disk (`dataset.cache_on_disk`), as a second run does.
Writes --out (markdown) and the same name with .json.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402
import e2e_compare  # noqa: E402
import four_way  # noqa: E402

PLAN = (20, 5, 5)  # Steps, warmup steps, log every: a short run, its start the larger part.


def study(args: argparse.Namespace) -> list[dict]:
  """Every (workload, processes) cell's rounds, each commit in turn."""
  runs = []
  with tempfile.TemporaryDirectory(prefix="startup_ab_") as tmp:
    trees = {name: e2e_compare.snapshot(commit, os.path.join(tmp, f"jaxdp_{name}"))
             for name, commit in args.commits.items()}
    for name, (_, revision) in trees.items():
      print(f"{name}: jaxdp {revision}", flush=True)
    for workload in args.workloads:
      data = four_way.prepare(workload, tmp, 0, next(iter(trees.values()))[0])
      for procs in args.procs:
        for r in range(-1, args.rounds):  # Round -1: untimed, writes the decoded split (and the compile cache).
          for i, (name, (tree, _)) in enumerate(trees.items()):
            ctx = four_way.context(tmp, tree, {workload: PLAN}, {workload: data})
            result = four_way.measure("jaxdp", workload, procs, ctx, 1000 * procs + 100 * (r + 1) + i)
            if r >= 0:
              runs.append({**result, "variant": name, "round": r})
              print(f"{workload} {procs}p round {r} {name}: setup {result['goodput_s']['setup']:.2f} s, "
                    f"wall {result['wall_s']:.2f} s", flush=True)
  return runs


def spread(values: list[float]) -> str:
  return f"{statistics.median(values):.2f} ({min(values):.2f}..{max(values):.2f})"


def report(runs: list[dict], args: argparse.Namespace, load_before: float) -> str:
  names = list(args.commits)
  lines = abrun.header("Start-up A/B: a short run's setup and whole wall at two commits", load_before,
                       "jaxdp's defaults (one process: a CPU device per core; under jaxdp.launch one per process)",
                       "python experiments/startup_ab.py " + " ".join(sys.argv[1:]))
  lines += [f"- ISA: {four_way.isa()}", "", f"Commits: {', '.join(f'{k}={v}' for k, v in args.commits.items())}. {PLAN[0]} steps a run.", "",
            "| workload | processes | commit | setup s (goodput) | wall s (command) | wall / first commit's, per round |",
            "| --- | --- | --- | --- | --- | --- |"]
  for workload in args.workloads:
    for procs in args.procs:
      cell = [r for r in runs if r["workload"] == workload and r["procs"] == procs]
      base = {r["round"]: r["wall_s"] for r in cell if r["variant"] == names[0]}
      for name in names:
        mine = [r for r in cell if r["variant"] == name]
        ratios = [r["wall_s"] / base[r["round"]] for r in mine]
        lines.append(f"| {workload} | {procs} | {name} | {spread([r['goodput_s']['setup'] for r in mine])} | "
                     f"{spread([r['wall_s'] for r in mine])} | {spread(ratios)} |")
  return "\n".join(lines) + "\n"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--commits", required=True, type=lambda s: dict(kv.split("=", 1) for kv in s.split(",")),
                      help="name=commit,...: the first is the base of the ratios; an empty commit: the working tree")
  parser.add_argument("--workloads", default="cnn,mlp", type=lambda s: s.split(","))
  parser.add_argument("--procs", default="1,2", type=lambda s: [int(p) for p in s.split(",")])
  parser.add_argument("--rounds", type=int, default=4)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup_ab.md"))
  args = parser.parse_args()
  load_before = abrun.load()
  runs = study(args)
  with open(args.out, "w") as f:
    f.write(report(runs, args, load_before))
  with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
    json.dump(runs, f, indent=1)
  print(open(args.out).read())


if __name__ == "__main__":
  main()
