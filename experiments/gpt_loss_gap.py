"""The small GPT's eval loss, jaxdp's CLI against the plain-JAX loop and torch: same init and order, then seeds.

    python experiments/gpt_loss_gap.py match [--seeds 0] [--steps 400] [--data_dir DIR]
    python experiments/gpt_loss_gap.py seeds [--seeds 0,1,2,3,4,5] [--sides jaxdp,jax,jax_jaxdp] [--steps 400]
    python experiments/gpt_loss_gap.py paired [--seeds 0,...,7] [--steps 400]   # jaxdp's draw in plain JAX and torch
    python experiments/gpt_loss_gap.py report --runs A.json,B.json   # seeds' table over several --json files

Sides (experiments/four_way.py's gpt workload, one process, each run a fresh command):
  jaxdp      `python -m jaxdp.train --config experiments/four_way_config_gpt.py`, its defaults (four_way.command);
  jax        experiments/four_way_jax.py as the study runs it: model.init(PRNGKey(seed)), numpy's order per epoch;
  jax_jaxdp  four_way_jax.py --init jaxdp --order jaxdp over the windows in the order jaxdp's prepared source holds
             them (TFDS writes a split's examples shuffled, so jaxdp's row i is not four_way's window i): jaxdp's
             initial parameters and jaxdp's batches, in the plain loop;
  jax_init   --init jaxdp only; jax_order  --order jaxdp only (each factor alone);
  torch_jaxdp  four_way_torch.py --init jaxdp --order jaxdp over the same windows: jaxdp's initial parameters
             loaded into the torch GPT, jaxdp's batches, in the eager torch loop.
`match` runs jaxdp and jax_jaxdp per seed with every step logged and compares their train losses step by step
(jaxdp's metrics.jsonl train/loss with log_every_steps=1 is that step's loss) and the final eval loss. `seeds`
runs the sides in turn per seed (A B C A B C) and prints each side's eval losses, mean and spread, and Welch's
t-test of jaxdp against each other side. `paired` runs jax_jaxdp and torch_jaxdp in turn per seed (jax_jaxdp
stands for jaxdp's CLI: `match` showed them equal to float rounding, and it is the cheaper run) and compares them
per seed: the same init and batches, so the difference is free of the init/order draw (paired t-test, sign test).
Prints a markdown section; --json writes every run's figures.
Findings: experiments/gpt_loss_gap.md.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402
import e2e_compare  # noqa: E402
import four_way  # noqa: E402

SIDES = ("jaxdp", "jax", "jax_jaxdp", "jax_init", "jax_order", "torch_jaxdp")
WORKER_FLAGS = {"jax": [], "jax_jaxdp": ["--init", "jaxdp", "--order", "jaxdp"], "jax_init": ["--init", "jaxdp"],
                "jax_order": ["--order", "jaxdp"], "torch_jaxdp": ["--init", "jaxdp", "--order", "jaxdp"]}
PAIRED = ("jax_jaxdp", "torch_jaxdp")  # `paired`: jaxdp's draw in the plain-JAX loop (= jaxdp's CLI) and in torch.
JAXDP_ROWS = "gpt_jaxdp_rows.npz"  # The windows in jaxdp's source order (the --order jaxdp sides read it).


def prepare(into: str, tree: str) -> tuple[str, list[str]]:
  """four_way's gpt data in `into` (kept: a second call reuses it) and the same windows in jaxdp's row order."""
  npz = os.path.join(into, "gpt.npz")
  flags = [f"--config.dataset.data_dir={os.path.join(into, 'tfds')}",
           f"--config.dataset.builder_kwargs.path={os.path.join(into, 'python_docs.txt')}"]  # four_way.prepare's.
  if not os.path.exists(os.path.join(into, JAXDP_ROWS)):
    npz, flags = four_way.prepare("gpt", into, 0, tree)
    write_jaxdp_rows(flags, os.path.join(into, JAXDP_ROWS))
  return npz, flags


def write_jaxdp_rows(data_flags: list[str], path: str) -> None:
  """Every split of jaxdp's prepared dataset, read by index 0..n-1, as the study's .npz arrays."""
  from jaxdp import data
  from jaxdp.tools import cli
  config = cli.parse(["gpt_loss_gap", "--config", four_way.config_arg("gpt"), "--workdir", os.path.dirname(path),
                      *data_flags])[0]
  ds = data.load(config.dataset)
  arrays = {}
  for split in four_way.SPLIT:
    rows = ds.source(split).read(np.arange(ds.num_examples(split)))
    arrays[f"x_{split}"], arrays[f"y_{split}"] = rows["inputs"], rows["labels"].astype(np.int32)
  np.savez(path, **arrays)


def command(side: str, seed: int, steps: int, log_every: int, data_dir: str, data: tuple[str, list[str]],
            workdir: str) -> list[str]:
  """One run's command line: four_way's, with the side's worker flags and .npz."""
  if side == "jaxdp":
    return four_way.command("jaxdp", "gpt", 1, steps, log_every, *data, workdir, seed)
  npz = os.path.join(data_dir, JAXDP_ROWS) if "--order" in WORKER_FLAGS[side] else data[0]
  worker = "torch" if side.startswith("torch") else "jax"
  return [*four_way.command(worker, "gpt", 1, steps, log_every, npz, data[1], workdir, seed), *WORKER_FLAGS[side]]


def run(side: str, seed: int, steps: int, log_every: int, data_dir: str, data: tuple[str, list[str]],
        tmp: str) -> dict:
  """One run: its train loss per logged step, final eval loss and accuracy, wall time and load."""
  name = f"{side}_{seed}_{steps}_{log_every}"
  workdir = os.path.join(tmp, name)
  cmd = command(side, seed, steps, log_every, data_dir, data, workdir)
  load = abrun.load()
  lines, wall, status = e2e_compare.run(cmd, os.path.join(tmp, name + ".log"), e2e_compare.REPO, four_way.ENV)
  if status:
    tail = "\n".join(line for _, line in lines[-30:])
    raise RuntimeError(f"{name} exited with status {status}:\n{tail}")
  if side == "jaxdp":
    records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    losses = {r["step"]: r["train/loss"] for r in records if "train/loss" in r}
  else:
    records = [json.loads(line) for _, line in lines if line.startswith("{")]
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}
  evals = [r for r in records if "eval/loss" in r][-1]
  check = next((r for r in records if "max_abs_logit_difference" in r), {})  # torch --init jaxdp's logit check.
  return {"side": side, "seed": seed, "steps": steps, "log_every": log_every, "losses": losses,
          "eval/loss": evals["eval/loss"], "eval/accuracy": evals["eval/accuracy"], "wall_s": wall,
          "max_abs_logit_difference": check.get("max_abs_logit_difference"),
          "load_before": load, "load_after": abrun.load(), "cmd": e2e_compare.shown(cmd).replace(tmp, "TMP")}


def match_report(a: dict, b: dict) -> list[str]:
  """Step-by-step agreement of two runs' train losses and their eval losses."""
  steps = sorted(set(a["losses"]) & set(b["losses"]))
  rel = np.array([abs(a["losses"][s] - b["losses"][s]) / abs(b["losses"][s]) for s in steps])
  exact = int(np.sum(rel == 0))
  lines = [f"seed {a['seed']}: {len(steps)} steps compared; bitwise equal {exact}; largest relative difference "
           + ", ".join(f"steps 1..{k} {rel[:k].max():.1e}" for k in (10, 50, 100, 200, len(steps)) if k <= len(steps))]
  first = next((s for s, r in zip(steps, rel) if r > 1e-3), None)
  lines.append(f"first step differing by more than 1e-3 (relative): {first}; train loss at step {steps[-1]}: "
               f"{a['side']} {a['losses'][steps[-1]]:.4f}, {b['side']} {b['losses'][steps[-1]]:.4f}; eval loss "
               f"{a['side']} {a['eval/loss']:.5f}, {b['side']} {b['eval/loss']:.5f} "
               f"(difference {a['eval/loss'] - b['eval/loss']:+.1e})")
  return lines


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
  """Welch's t statistic and two-sided p-value of mean(a) - mean(b)."""
  from scipy import stats
  t, p = stats.ttest_ind(a, b, equal_var=False)
  return float(t), float(p)


def seeds_report(runs: list[dict], sides: list[str]) -> list[str]:
  """Each side's eval loss per seed, mean and spread; jaxdp against each other side."""
  by = {s: {r["seed"]: r["eval/loss"] for r in runs if r["side"] == s} for s in sides}
  seeds = sorted({r["seed"] for r in runs})
  lines = ["| side | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | sd | min..max |",
           "| --- | " + " | ".join("---" for _ in seeds) + " | --- | --- | --- |"]
  for side in sides:
    v = [by[side][s] for s in seeds if s in by[side]]
    lines.append(f"| {side} | " + " | ".join(f"{by[side][s]:.4f}" if s in by[side] else "" for s in seeds)
                 + f" | {statistics.mean(v):.4f} | {statistics.stdev(v) if len(v) > 1 else 0:.4f} "
                 f"| {min(v):.4f}..{max(v):.4f} |")
  lines.append("")
  for other in sides:
    if other == "jaxdp" or "jaxdp" not in by or len(by[other]) < 2 or len(by["jaxdp"]) < 2:
      continue
    a, b = list(by["jaxdp"].values()), list(by[other].values())
    t, p = welch(a, b)
    paired = [by["jaxdp"][s] - by[other][s] for s in seeds if s in by["jaxdp"] and s in by[other]]
    lines.append(f"- jaxdp - {other}: mean {statistics.mean(a) - statistics.mean(b):+.4f} "
                 f"({100 * (statistics.mean(a) / statistics.mean(b) - 1):+.2f}%), Welch t {t:+.2f}, p {p:.2f}; "
                 f"per seed {', '.join(f'{d:+.4f}' for d in paired)}")
  return lines


def paired_report(runs: list[dict]) -> list[str]:
  """Per seed: both sides' step-1 train loss and eval loss, their difference; paired t-test and sign test."""
  from scipy import stats
  by = {(r["side"], r["seed"]): r for r in runs}
  a_side, b_side = PAIRED
  seeds = sorted({r["seed"] for r in runs if (a_side, r["seed"]) in by and (b_side, r["seed"]) in by})
  lines = [f"| seed | torch initial logits vs jaxdp's (max abs difference) | step-1 train loss {a_side} / {b_side} "
           f"(relative difference) | eval loss {a_side} | eval loss {b_side} | {a_side} - {b_side} |",
           "| --- | --- | --- | --- | --- | --- |"]
  diffs = []
  for s in seeds:
    a, b = by[(a_side, s)], by[(b_side, s)]
    la, lb = (r["losses"].get(1, r["losses"].get("1")) for r in (a, b))  # int keys; str once read from --json.
    diffs.append(a["eval/loss"] - b["eval/loss"])
    lines.append(f"| {s} | {b['max_abs_logit_difference']:.1e} | {la:.6f} / {lb:.6f} ({abs(la - lb) / lb:.1e}) "
                 f"| {a['eval/loss']:.5f} | {b['eval/loss']:.5f} | {diffs[-1]:+.1e} |")
  lines.append("")
  ea, eb = [by[(a_side, s)]["eval/loss"] for s in seeds], [by[(b_side, s)]["eval/loss"] for s in seeds]
  mean, sd = statistics.mean(diffs), statistics.stdev(diffs) if len(diffs) > 1 else 0.0
  positive = sum(d > 0 for d in diffs)
  summary = (f"- {len(seeds)} seeds: mean eval loss {a_side} {statistics.mean(ea):.4f}, {b_side} "
             f"{statistics.mean(eb):.4f}; {a_side} - {b_side}: mean {mean:+.1e} "
             f"({100 * (statistics.mean(ea) / statistics.mean(eb) - 1):+.4f}%), sd {sd:.1e}")
  if len(diffs) > 1:
    t, p = stats.ttest_rel(ea, eb)
    half = stats.t.ppf(0.975, len(diffs) - 1) * sd / len(diffs) ** 0.5
    sign = stats.binomtest(positive, len(diffs)).pvalue
    summary += (f", 95% interval {mean - half:+.1e}..{mean + half:+.1e}; paired t {t:+.2f}, p {p:.2f}; "
                f"{positive} of {len(diffs)} seeds positive ({a_side} worse), two-sided sign test p {sign:.2f}")
  return lines + [summary]


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("mode", choices=("match", "seeds", "paired", "report"))
  parser.add_argument("--seeds", type=lambda text: [int(v) for v in text.split(",") if v], default=None,
                      help="Seeds (default: match 0; seeds, paired 0,1,2,3,4,5).")
  parser.add_argument("--sides", type=four_way.csv(SIDES), default=["jaxdp", "jax", "jax_jaxdp"],
                      help="seeds: the sides, run in turn per seed.")
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--log_every", type=int, default=0, help="Default: match 1, seeds 25.")
  parser.add_argument("--data_dir", default="", help="Where the data is prepared (kept); default: a temporary one.")
  parser.add_argument("--json", default="", help="Write every run's figures here.")
  parser.add_argument("--runs", type=lambda text: [v for v in text.split(",") if v], default=[],
                      help="report: the --json files of earlier seeds runs, reported as one.")
  args = parser.parse_args(argv)
  args.seeds = args.seeds if args.seeds is not None else ([0] if args.mode == "match" else list(range(6)))
  args.log_every = args.log_every or (1 if args.mode == "match" else 25)
  return args


def main(argv: list[str]) -> list[dict]:
  args = parse(argv)
  if args.mode == "report":
    runs = [r for path in args.runs for r in json.load(open(path))["runs"]]
    sides = list(dict.fromkeys(r["side"] for r in runs))
    print("\n".join(paired_report(runs) if sides == list(PAIRED) else seeds_report(runs, sides)))
    return runs
  lines = abrun.header(f"gpt_loss_gap {args.mode}", abrun.load(), f"1 CPU device, one process; ISA {four_way.isa()}")
  runs = []
  with tempfile.TemporaryDirectory(prefix="gpt_loss_gap_") as tmp:
    data_dir = args.data_dir or tmp
    os.makedirs(data_dir, exist_ok=True)
    data = prepare(data_dir, e2e_compare.REPO)
    sides = {"match": ["jaxdp", "jax_jaxdp"], "paired": list(PAIRED)}.get(args.mode, args.sides)
    for seed in args.seeds:
      for side in sides:
        runs.append(run(side, seed, args.steps, args.log_every, data_dir, data, tmp))
        print(f"{side} seed {seed}: eval loss {runs[-1]['eval/loss']:.4f}, {runs[-1]['wall_s']:.0f} s, "
              f"load {runs[-1]['load_before']:.1f}", flush=True)
      if args.mode == "match":
        lines += match_report(*runs[-2:])
  if args.mode == "seeds":
    lines += seeds_report(runs, sides)
  if args.mode == "paired":
    lines += paired_report(runs)
  lines += ["", "Commands: " + "; ".join(f"`{r['cmd']}`" for r in runs[:len(sides)])]
  print("\n".join(lines))
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"args": vars(args), "runs": runs}, f, indent=1)
  return runs


if __name__ == "__main__":
  main(sys.argv[1:])
