"""Input pipeline: how long jaxdp's loop waits for input, and how fast it feeds JPEGs, through the CLI.

    python benchmarks/input_pipeline.py [--cases memory,tokens,jpeg] [--rounds 3] [--steps 300] \
        [--before CHECKOUT] [--out input_pipeline.md]

Each case is a fresh `python -m jaxdp.train` on data a user gives it, read back from its goodput.json and its
log lines (the steady window after --steps / 3 steps):
  memory  in-memory arrays: the four-way study's MLP (784-1024-1024-10, batch 1024) on a synthetic float32 .npz;
  tokens  a token file: configs/gpt_token_file.py's GPT (4 layers, width 128, context 64, batch 12) on 1 MB
          of random byte tokens;
  jpeg    generated ImageNet-like JPEGs (`synthetic_jpegs`, about 80 KB each) decoded, cropped to 224 x 224 and
          flipped, batch 64, for a one-layer MLP whose step costs little: the rate is the pipeline's.
Reported per case: input wait as a share of the wall time (wanted: under 1% for memory and tokens) and
samples/s. With --before, each round also runs that checkout's jaxdp (its own code on PYTHONPATH), the two
alternating, with the per-round ratio this / before (the JPEG rate: wanted >= 1).
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402
import four_way  # noqa: E402

CASES = ("memory", "tokens", "jpeg")


def case_flags(case: str, tmp: str) -> list[str]:
  """The config and data flags of one case (its data written into `tmp` once)."""
  data_dir = f"--config.dataset.data_dir={os.path.join(tmp, 'tfds')}"
  if case == "memory":
    npz = os.path.join(tmp, "mlp.npz")
    if not os.path.exists(npz):
      four_way.synthetic("mlp", 60_000, npz)
    return ["--config", four_way.config_arg("mlp"), f"--config.dataset.name={npz}", data_dir]  # With config_env.
  if case == "tokens":
    path = os.path.join(tmp, "tokens.bin")
    if not os.path.exists(path):
      from jaxdp.datasets import token_file
      token_file.write(np.random.RandomState(0).randint(0, 256, 2**20), path, vocab_size=256)
    return ["--config", os.path.join(abrun.REPO, "jaxdp/configs/gpt_token_file.py"), "--config.batch_size=12",
            "--config.dataset.builder_kwargs.seq_len=64", f"--config.dataset.builder_kwargs.path={path}", data_dir]
  return ["--config", os.path.join(abrun.REPO, "jaxdp/configs/mlp_digits.py"), "--config.dataset.name=synthetic_jpegs",
          "--config.dataset.image_size=224", "--config.dataset.flip=true", "--config.batch_size=64",
          "--config.model.hidden=(8,)", data_dir]


def measure(case: str, tree: str, tmp: str, steps: int, index: int) -> dict[str, float]:
  """One fresh run of `tree`'s jaxdp: input share of the wall (goodput.json) and steady samples/s (log lines)."""
  workdir = os.path.join(tmp, f"{case}_{index}_{abs(hash(tree))}")
  log_every = max(steps // 12, 1)
  cmd = [sys.executable, "-m", "jaxdp.train", *case_flags(case, tmp), "--workdir", workdir,
         f"--config.num_train_steps={steps}", f"--config.log_every_steps={log_every}",
         f"--config.eval_every_steps={steps}", f"--config.checkpoint_every_steps={steps}"]
  lines, _, status = abrun.run(cmd, workdir + ".log", tree, four_way.config_env("mlp") if case == "memory" else {})
  if status:
    raise RuntimeError(f"{case} exited with status {status}:\n" + "\n".join(line for _, line in lines[-30:]))
  seconds = json.load(open(os.path.join(workdir, "goodput.json")))["seconds"]
  stamps = abrun.log_steps("jaxdp", lines)
  first, last = abrun.window(stamps, steps // 3)
  batch = {"memory": 1024, "tokens": 12, "jpeg": 64}[case]
  return {"input_share": seconds["input"] / seconds["wall"],
          "samples_per_s": abrun.self_reported("jaxdp", lines, workdir, first, last, batch)}


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", type=four_way.csv(CASES), default=list(CASES))
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=300, help="Train steps per run (the window: the last 2/3).")
  parser.add_argument("--before", default="", help="A checkout of jaxdp to alternate with (its jaxdp/ is run).")
  parser.add_argument("--out", default=None, help="Markdown results (also printed).")
  return parser.parse_args(argv)


def main(argv: list[str]) -> dict:
  args = parse(argv)
  trees = {"this": abrun.REPO, **({"before": os.path.abspath(args.before)} if args.before else {})}
  load_before = abrun.load()
  runs: dict[tuple[str, str], list[dict]] = {}
  with tempfile.TemporaryDirectory(prefix="input_pipeline_") as tmp:
    for case in args.cases:
      for r in range(args.rounds):
        for name in abrun.in_turn(list(trees), r):
          runs.setdefault((case, name), []).append(measure(case, trees[name], tmp, args.steps, r))
  lines = abrun.header("Input pipeline: input wait and rate through jaxdp's CLI", load_before, "jaxdp's defaults")
  lines += ["| case | code | input wait, % of wall | samples/s | this / before, samples/s |", "|---|---|---|---|---|"]
  for (case, name), rs in runs.items():
    share, rate = [100 * r["input_share"] for r in rs], [r["samples_per_s"] for r in rs]
    vs = ""
    if name == "this" and (case, "before") in runs:
      vs = abrun.fmt(abrun.ratios(rate, [r["samples_per_s"] for r in runs[(case, "before")]]))
    lines.append(f"| {case} | {name} | {abrun.fmt(share)} | {abrun.fmt_rate(rate)} | {vs} |")
  abrun.write(args.out, lines)
  return {f"{case}/{name}": rs for (case, name), rs in runs.items()}


if __name__ == "__main__":
  main(sys.argv[1:])
