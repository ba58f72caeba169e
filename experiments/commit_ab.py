"""A/B of jaxdp at two (or more) commits, end to end, with torch beside them: four_way's workloads, alternating.

    python experiments/commit_ab.py --commits before=f6d00a9,after=HEAD --workloads mlp --procs 2 --rounds 3

Each round runs every commit's jaxdp CLI and then torch (four_way.py's commands and data), each a fresh
command; reports ms per step, eval loss and the per-round ratios against the first commit and against torch.
Writes --out (markdown) and the same name with .json.
"""

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402
import e2e_compare  # noqa: E402
import four_way  # noqa: E402
import four_way_configs  # noqa: E402


def study(args: argparse.Namespace) -> list[dict]:
  """Every workload's rounds: each commit's jaxdp in turn, then torch."""
  runs = []
  with tempfile.TemporaryDirectory(prefix="commit_ab_") as tmp:
    trees = {name: e2e_compare.snapshot(commit, os.path.join(tmp, f"jaxdp_{name}"))
             for name, commit in args.commits.items()}
    for name, (_, revision) in trees.items():
      print(f"{name}: jaxdp {revision}", flush=True)
    contenders = [(name, "jaxdp", tree) for name, (tree, _) in trees.items()] + [("torch", "torch", e2e_compare.REPO)]
    for workload in args.workloads:
      data = four_way.prepare(workload, tmp, 0, next(iter(trees.values()))[0])
      for r in range(args.rounds):
        for i, (name, side, tree) in enumerate(contenders):
          ctx = four_way.context(tmp, tree, {workload: four_way.DEFAULTS[workload]}, {workload: data})
          # Its own workdir per contender and round (index): a second run in one workdir would resume.
          result = {**four_way.measure(side, workload, args.procs, ctx, 100 * r + i), "variant": name, "round": r,
                    "jaxdp": trees[name][1] if name in trees else ""}
          runs.append(result)
          print(f"{workload} round {r} {name}: {result['ms_per_step']:.1f} ms/step, eval loss "
                f"{result.get('eval/loss', float('nan')):.4f}, load {result['load_before']:.1f}", flush=True)
  return runs


def report(runs: list[dict], names: list[str], procs: int, load_before: float, argv: list[str]) -> list[str]:
  """The markdown: per workload, ms/step per contender, per-round ratios against the first commit and torch."""
  lines = abrun.header("jaxdp at several commits against torch, end to end", load_before,
                       f"{procs} process(es); jaxdp's and torch's defaults",
                       "python experiments/commit_ab.py " + shlex.join(argv))
  lines += [f"- ISA: {four_way.isa()}"]
  lines += [f"- {r['variant']}: jaxdp {r['jaxdp']}" for r in runs if r["round"] == 0 and r["variant"] != "torch"
            and r["workload"] == runs[0]["workload"]]
  contenders = names + ["torch"]
  lines += ["", "| workload | " + " | ".join(f"{c}: ms/step" for c in contenders) + " | "
            + " | ".join(f"{c} / {names[0]} (time)" for c in names[1:]) + " | "
            + " | ".join(f"{c} / torch (samples/s)" for c in names) + " | eval loss |",
            "| --- " * (2 + 2 * len(names) + len(contenders) - 1) + "|"]
  for workload in dict.fromkeys(r["workload"] for r in runs):
    ms = {c: [r["ms_per_step"] for r in runs if r["workload"] == workload and r["variant"] == c] for c in contenders}
    loss = {c: statistics.median(r.get("eval/loss", float("nan")) for r in runs
                                 if r["workload"] == workload and r["variant"] == c) for c in contenders}
    lines.append(f"| {workload} | " + " | ".join(f"{statistics.median(v):.1f} ({min(v):.1f}..{max(v):.1f})"
                                                 for v in ms.values()) + " | "
                 + " | ".join(abrun.fmt(abrun.ratios(ms[c], ms[names[0]])) for c in names[1:]) + " | "
                 + " | ".join(abrun.fmt(abrun.ratios(ms["torch"], ms[c])) for c in names) + " | "
                 + ", ".join(f"{c} {v:.4f}" for c, v in loss.items()) + " |")
  return lines + ["", "Ratios per round, median (min..max): time ratios < 1 mean faster than the first commit; "
                  "/ torch > 1 means jaxdp faster than torch."]


def commits(text: str) -> dict[str, str]:
  """'name=commit,name=commit' (a commit '' is the working tree)."""
  pairs = [item.split("=", 1) for item in text.split(",")]
  if any(len(p) != 2 or not p[0] for p in pairs):
    raise argparse.ArgumentTypeError(f"expected name=commit,name=commit, got {text!r}")
  return dict(pairs)


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--commits", type=commits, required=True)
  parser.add_argument("--workloads", type=four_way.csv(four_way_configs.NAMES), default=["mlp"])
  parser.add_argument("--procs", type=int, default=2)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--out", default=os.path.join(four_way.HERE, "commit_ab.md"))
  args = parser.parse_args(argv)
  load_before = abrun.load()
  runs = study(args)
  abrun.write(args.out, report(runs, list(args.commits), args.procs, load_before, argv))
  with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
    json.dump({"command": shlex.join(["python", "experiments/commit_ab.py", *argv]), "runs": runs}, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1:])
