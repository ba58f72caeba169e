"""A/B of jaxdp's CLI on one CPU process: N simulated devices (one per core) against one device, end to end.

    python experiments/cpu_devices_ab.py --workloads mlp,cnn,resnet,gpt --counts 1,2 --rounds 3

One device runs each op of the step on XLA:CPU's intra-op threads; many ops of a small model's step are too
small to be split, so one core idles. N devices run N data-parallel slices of the step side by side, one per
core, and average the gradients in memory. Each round runs every count in turn (JAXDP_CPU_DEVICES=N), on
four_way.py's workloads and data; writes experiments/cpu_devices_ab.md and .json.
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
  """Every workload's rounds of every device count in turn."""
  runs = []
  with tempfile.TemporaryDirectory(prefix="cpu_devices_ab_") as tmp:
    tree, revision = e2e_compare.snapshot(args.commit, os.path.join(tmp, "jaxdp_tree"))
    print(f"jaxdp: {revision}", flush=True)
    plan = {w: four_way.DEFAULTS[w] for w in args.workloads}
    ctx = four_way.context(tmp, tree, plan)
    for workload in args.workloads:
      ctx["data"][workload] = four_way.prepare(workload, tmp, 0, tree)
      for r in range(args.rounds):
        for count in args.counts:
          ctx["env"] = {"jaxdp": {"JAXDP_CPU_DEVICES": str(count)}}
          # Its own workdir per count (index): a second run in the first's would resume at its last step.
          result = {**four_way.measure("jaxdp", workload, 1, ctx, 100 * r + count), "round": r, "devices": count,
                    "jaxdp": revision}
          runs.append(result)
          print(f"{workload} round {r} {count} device(s): {result['ms_per_step']:.1f} ms/step, eval loss "
                f"{result.get('eval/loss', float('nan')):.4f}, load {result['load_before']:.1f}", flush=True)
  return runs


def report(runs: list[dict], counts: list[int], load_before: float) -> list[str]:
  """The markdown: per workload, ms/step per count, ratios against one device per round, eval loss."""
  lines = abrun.header("One CPU process: N simulated devices against one, jaxdp's CLI end to end", load_before,
                       "1 process; JAXDP_CPU_DEVICES=N")
  lines += [f"- ISA: {four_way.isa()}; jaxdp: {runs[0]['jaxdp']}", "",
            "| workload | global batch | " + " | ".join(f"{c} device(s): ms/step" for c in counts)
            + " | " + " | ".join(f"1 / {c} devices" for c in counts[1:]) + " | eval loss per count |",
            "| --- " * (1 + 2 * len(counts)) + "| --- |"]
  for workload in dict.fromkeys(r["workload"] for r in runs):
    by = {c: [r for r in runs if r["workload"] == workload and r["devices"] == c] for c in counts}
    ms = {c: [r["ms_per_step"] for r in rs] for c, rs in by.items()}
    speedups = [abrun.ratios(ms[counts[0]], ms[c]) for c in counts[1:]]  # 1-device ms / N-device ms = N devices samples/s ratio.
    lines.append(f"| {workload} | {by[counts[0]][0]['global_batch']} | "
                 + " | ".join(f"{statistics.median(v):.1f} ({min(v):.1f}..{max(v):.1f})" for v in ms.values())
                 + " | " + " | ".join(abrun.fmt(s) for s in speedups) + " | "
                 + ", ".join(f"{statistics.median(r.get('eval/loss', float('nan')) for r in rs):.4f}"
                             for rs in by.values()) + " |")
  return lines + ["", "1 / N: the per-round ratio of one device's ms per step to N devices' (> 1: N devices faster)."]


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workloads", type=four_way.csv(four_way_configs.NAMES), default=list(four_way_configs.NAMES))
  parser.add_argument("--counts", type=four_way.csv(tuple(range(1, 17))), default=[1, 2])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--commit", default="HEAD", help="jaxdp commit to run (extracted); '': the working tree.")
  parser.add_argument("--out", default=os.path.join(four_way.HERE, "cpu_devices_ab.md"))
  args = parser.parse_args(argv)
  load_before = abrun.load()
  runs = study(args)
  abrun.write(args.out, report(runs, args.counts, load_before))
  with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
    json.dump({"command": shlex.join(["python", "experiments/cpu_devices_ab.py", *argv]), "runs": runs}, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1:])
