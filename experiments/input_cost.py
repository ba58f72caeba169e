"""What the input costs a run whose batches need no decoding: the CLI with one transfer per step, with blocks of
steps per transfer (jaxdp.blocks, the default), and with no input at all (the first device batch reused every
step: the ceiling), alternated round by round.

    python experiments/input_cost.py [--rounds 3] [--config jaxdp/configs/default.py] [--cpu_devices 8] \
        [--out experiments/input_cost.md] [-- extra jaxdp.train flags]

Per run: the progress line's ms/step (its average over the timed steps), goodput's time/total/input and
its share of time/total/wall. Results are printed and appended to --out as a markdown section.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = {"per_step": ["--config.parallel.block_mb=0"], "blocks": [], "no_input": ["--config.parallel.block_mb=0"]}
# The no-input variant: the prefetcher hands out its first device batch forever (same shapes, same program).
NO_INPUT = """
import runpy, sys
from jaxdp import parallel
real = parallel.Prefetcher.__next__
def first_forever(self):
  if not hasattr(self, "_first"):
    self._first = real(self)
  return self._first
parallel.Prefetcher.__next__ = first_forever
sys.argv = ["jaxdp.train", *sys.argv[1:]]
runpy.run_module("jaxdp.tools.train", run_name="__main__")
"""


def run(variant: str, args: argparse.Namespace) -> dict[str, float]:
  """One fresh CLI run of `variant`; its ms/step, input seconds and input share of the wall time."""
  with tempfile.TemporaryDirectory() as workdir:
    flags = ["--config", args.config, "--workdir", workdir, "--cpu_devices", str(args.cpu_devices),
             *VARIANTS[variant], *args.extra]
    cmd = [sys.executable, "-c", NO_INPUT, *flags] if variant == "no_input" else [
        sys.executable, "-m", "jaxdp.train", *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    ms = float(re.search(r"done \|.*\| ([\d.]+) ms/step", out).group(1))
    last = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))][-1]
    return {"ms_per_step": ms, "input_s": last["time/total/input"],
            "input_share": last["time/total/input"] / last["time/total/wall"]}


def cpu() -> str:
  """lscpu's model name and whether it has AVX2 / AVX-512."""
  text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
  model = re.search(r"Model name:\s*(.*)", text)
  flags = re.search(r"Flags:\s*(.*)", text)
  isa = [f for f in ("avx2", "fma", "avx512f") if flags and f in flags.group(1).split()]
  return f"{model.group(1).strip() if model else platform.processor()}, {os.cpu_count()} cores, {'+'.join(isa)}"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--config", default="jaxdp/configs/default.py")
  parser.add_argument("--cpu_devices", type=int, default=8)
  parser.add_argument("--out", default="experiments/input_cost.md")
  parser.add_argument("extra", nargs="*", help="More jaxdp.train flags (after --).")
  args = parser.parse_args()
  results = {v: [] for v in VARIANTS}
  load = [os.getloadavg()[0]]
  for r in range(args.rounds):
    for variant in VARIANTS:
      results[variant].append(run(variant, args))
      print(variant, r, results[variant][-1], flush=True)
    load.append(os.getloadavg()[0])
  lines = [f"\n## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: `{args.config}`, {args.cpu_devices} "
           f"simulated devices {' '.join(args.extra)}",
           f"- machine: {cpu()}; load {min(load):.1f}..{max(load):.1f}; {args.rounds} rounds, alternating",
           "", "| variant | ms/step, median (min..max) | time/input s | input share of wall | ms/step / no_input |",
           "|---|---|---|---|---|"]
  base = [x["ms_per_step"] for x in results["no_input"]]
  for variant, runs in results.items():
    ms = [x["ms_per_step"] for x in runs]
    ratio = [a / b for a, b in zip(ms, base)]
    lines.append(f"| {variant} | {statistics.median(ms):.2f} ({min(ms):.2f}..{max(ms):.2f}) | "
                 f"{statistics.median(x['input_s'] for x in runs):.3f} | "
                 f"{100 * statistics.median(x['input_share'] for x in runs):.2f}% | "
                 f"{statistics.median(ratio):.3f} ({min(ratio):.3f}..{max(ratio):.3f}) |")
  text = "\n".join(lines) + "\n"
  print(text)
  if not os.path.exists(args.out):
    text = "# What input with nothing to decode costs a run (`experiments/input_cost.py`)\n" + text
  with open(args.out, "a") as f:
    f.write(text)


if __name__ == "__main__":
  main()
