"""Equivalence (Goyal et al., 2017): N devices x B/N examples train like 1 device x B, for N = 1, 2, 4, 8.

    python benchmarks/equivalence.py [--devices 1,2,4,8] [--modes default,invariant] [--steps 200] [--batch 128] \
        [--out benchmarks/equivalence.md]

Runs the default config (CNN, Adam) on the offline `digits` dataset through `train.train_and_evaluate`
once per N, with `parallel.num_devices = N` of 8 simulated CPU devices, the same seed and the same
global batch, logging the train loss at every step; once in the default mode (one all-reduce: float
sums in a device-count-dependent order) and once with `parallel.invariant` (a fixed order of the
gradient sum). Draws the loss curves overlaid (and |loss_N - loss_1| below) into a PNG next to the
results file, and prints the largest difference from N = 1 per mode.
"""

import sys

from jaxdp.runtime import cpu_devices

if __name__ == "__main__":  # Before JAX is imported: XLA reads XLA_FLAGS once.
  cpu_devices.simulate(8)

import argparse  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402

from jaxdp.tools import plot  # noqa: E402
from jaxdp import train
from jaxdp.configs import default  # noqa: E402

Curve = tuple[list[int], list[float]]


MODES = {"default": False, "invariant": True}  # name -> parallel.invariant


def run(num_devices: int, steps: int, batch: int, data_dir: str | None, workdir: str,
        invariant: bool = False) -> tuple[Curve, dict]:
  """One training run on `num_devices` devices; its per-step train loss and final eval metrics."""
  config = default.get_config()
  config.parallel.num_devices = num_devices
  config.parallel.invariant = invariant
  config.batch_size = batch
  config.num_train_steps = steps
  config.log_every_steps = 1
  config.eval_every_steps = steps
  config.checkpoint_every_steps = 0
  config.dataset.data_dir = data_dir
  result = train.train_and_evaluate(config, workdir)
  return plot.curves(workdir)["train/loss"], result.eval_metrics


def largest_difference(curve: Curve, reference: Curve) -> tuple[float, float, int]:
  """Largest |loss - reference| over the steps, the largest relative difference, and the step of the first."""
  diffs = [(abs(a - b), abs(a - b) / abs(b), s) for s, a, b in zip(curve[0], curve[1], reference[1])]
  worst = max(diffs)
  return worst[0], max(d[1] for d in diffs), worst[2]


def draw(curves: dict[str, dict[int, Curve]], batch: int, path: str) -> None:
  """Per mode (columns): loss curves overlaid (top) and |loss_N - loss_1| (bottom, log scale)."""
  fig = Figure(figsize=(12, 6), layout="constrained")
  axes = fig.subplots(2, len(curves), sharex=True, height_ratios=(2, 1), squeeze=False)
  for col, (mode, by_n) in enumerate(curves.items()):
    top, bottom = axes[0, col], axes[1, col]
    reference = by_n[min(by_n)]
    for i, (n, (steps, losses)) in enumerate(sorted(by_n.items())):
      top.plot(steps, losses, color=f"C{i}", lw=1.5 if n == min(by_n) else 1, ls="-" if i % 2 == 0 else "--",
               label=f"{n} device{'s' * (n > 1)} x {batch // n}")
      if n != min(by_n):
        bottom.plot(steps, [max(abs(a - b), 1e-9) for a, b in zip(losses, reference[1])], color=f"C{i}",
                    label=f"N = {n}")
    top.set(yscale="log", ylabel="train loss", title=f"{mode} mode: N devices x {batch}/N vs 1 x {batch}")
    top.legend()
    bottom.set(yscale="log", ylim=(5e-10, 1e-1), xlabel="step", ylabel=f"|loss_N - loss_{min(by_n)}| (0 at 1e-9)")
    bottom.legend(fontsize="small")
  fig.suptitle("digits, CNN, Adam: the loss curve of N devices x B/N against 1 device x B")
  fig.savefig(path, dpi=100)


def report(curves: dict[str, dict[int, Curve]], evals: dict, args: argparse.Namespace, png: str,
           load_before: float) -> list[str]:
  """Markdown: header, one row per (mode, N) with the largest differences and the final eval, the PNG."""
  dev = jax.devices()[0]
  lines = abrun.header("Equivalence: N devices x B/N vs 1 device x B", load_before,
                       f"{jax.device_count()} x {dev.platform} ({dev.device_kind}), simulated; jax {jax.__version__}")
  lines += [f"Default config (CNN, Adam, lr 3e-3) on `digits`, global batch {args.batch}, {args.steps} steps, "
            "seed 0; the train loss of every step. The largest differences are over all steps, against the "
            "smallest N. Default mode: the gradients are summed in an order that depends on N, so rounding "
            "differs in the last bits and (training being chaotic) grows slowly; invariant mode "
            "(`parallel.invariant`): one fixed order for every N.", "",
            "| mode | N | per-device batch | largest abs loss diff (step) | largest rel diff | final train loss | "
            "eval accuracy | eval loss |", "| --- " * 8 + "|"]
  for mode, by_n in curves.items():
    ref = min(by_n)
    for n in sorted(by_n):
      diff, rel, step = largest_difference(by_n[n], by_n[ref])
      lines.append(f"| {mode} | {n} | {args.batch // n} | {diff:.2e} ({step}) | {rel:.2e} | {by_n[n][1][-1]:.5f} | "
                   f"{evals[mode, n]['eval/accuracy']:.4f} | {evals[mode, n]['eval/loss']:.5f} |")
  lines.append("")
  for mode, by_n in curves.items():
    worst = max(largest_difference(by_n[n], by_n[min(by_n)])[0] for n in by_n)
    lines.append(f"- {mode} mode: largest difference of any N from N = {min(by_n)}: **{worst:.2e}** in train loss.")
  lines += ["", f"![loss curves]({os.path.basename(png)})"]
  return lines


def main(argv: list[str]) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--devices", default="1,2,4,8", help="comma-separated device counts (the smallest is the reference)")
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--batch", type=int, default=128, help="global batch, divisible by every device count")
  p.add_argument("--modes", default="default,invariant", help=f"comma-separated, from {', '.join(MODES)}")
  p.add_argument("--data_dir", default=None, help="TFDS data_dir (default: TFDS's); digits is prepared offline")
  p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "equivalence.md"))
  args = p.parse_args(argv)
  load_before = abrun.load()
  curves: dict[str, dict[int, Curve]] = {}
  evals = {}
  for mode in args.modes.split(","):
    curves[mode] = {}
    for n in (int(x) for x in args.devices.split(",")):
      with tempfile.TemporaryDirectory() as workdir:
        curves[mode][n], evals[mode, n] = run(n, args.steps, args.batch, args.data_dir, workdir, MODES[mode])
  png = os.path.splitext(args.out)[0] + ".png"
  draw(curves, args.batch, png)
  abrun.write(args.out, report(curves, evals, args, png, load_before))


if __name__ == "__main__":
  main(sys.argv[1:])
