"""`python -m jaxdp.plot WORKDIR [WORKDIR ...] [--out PNG]`: the curves of every metric runs wrote, as one PNG."""

import argparse
import math
import os
import sys

from matplotlib.figure import Figure  # No pyplot: no global backend is chosen or changed (Agg canvas).

from jaxdp.config import ConfigError
from jaxdp.report import metrics
from jaxdp.tools import cli

SPLITS = (("train", "-"), ("eval", "--"))  # A panel's curves: the split and its line style.
# Counts jaxdp keeps about the run itself, not curves of the task: the examples of each eval (the same
# every time), updates skipped for NaN/Inf, bad examples skipped (the summary and the log say them).
BOOKKEEPING = ("num_examples", "nonfinite", "zero_weight", "overflow", "skipped_examples")
COLUMNS = 3  # Panels per row.
DEFAULT_NAME = "curves.png"


def curves(workdir: str) -> dict[str, tuple[list[int], list[float]]]:
  """`train/loss`, `eval/accuracy`, ... -> (steps, values); a step written twice (a resumed run) keeps its last value."""
  path = os.path.join(workdir, metrics.METRICS_FILE)
  if not os.path.isfile(path):
    raise ConfigError(f"no {metrics.METRICS_FILE} in {workdir!r}")
  by_key: dict[str, dict[int, float]] = {}
  for record in metrics.read(workdir):
    for key, value in record.items():
      if key.startswith(("train/", "eval/")) and isinstance(value, int | float):
        by_key.setdefault(key, {})[int(record["step"])] = float(value)
  return {key: (sorted(points), [points[s] for s in sorted(points)]) for key, points in by_key.items()}


def panels(runs: list[dict[str, tuple[list[int], list[float]]]]) -> list[str]:
  """The metric names to draw, one panel each: `loss` first, then in the order the runs wrote them."""
  names: dict[str, None] = {}  # Ordered, without repeats.
  for run in runs:
    for key in run:
      name = key.split("/", 1)[1]
      if name not in BOOKKEEPING:
        names[name] = None
  return sorted(names, key=lambda name: name != "loss")  # Stable: the rest keep their order.


def figure(workdirs: list[str]) -> Figure:
  """One panel per metric of the runs in `workdirs`, the train and eval curves of each run in it."""
  labels = [os.path.basename(os.path.normpath(w)) for w in workdirs]  # Its whole path where two runs share a name.
  runs = {label if labels.count(label) == 1 else w: curves(w) for w, label in zip(workdirs, labels)}
  names = panels(list(runs.values()))
  if not names:
    raise ConfigError(f"no train/ or eval/ metrics in {', '.join(map(repr, workdirs))}")
  columns = min(len(names), COLUMNS)
  rows = math.ceil(len(names) / columns)
  fig = Figure(figsize=(max(11, 4.5 * columns), 4 * rows), layout="constrained")
  axes = list(fig.subplots(rows, columns, squeeze=False).flat)
  for ax, name in zip(axes, names):
    for color, (label, run) in enumerate(runs.items()):
      for split, style in SPLITS:
        if f"{split}/{name}" in run:
          steps, values = run[f"{split}/{name}"]
          ax.plot(steps, values, style, color=f"C{color}", marker="o" if split == "eval" or len(steps) < 3 else None,
                  markersize=4, label=f"{label} {split}")
    ax.set(title=name, xlabel="step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
  for ax in axes[len(names):]:  # The last row's unused places.
    ax.set_visible(False)
  return fig


def plot(workdirs: list[str], out: str) -> str:
  """Draws every run's metric curves into the PNG `out`; returns its path."""
  fig = figure(workdirs)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=110)
  return out


def main(argv: list[str]) -> int:
  """Runs the CLI; returns the exit status (2 for a run that cannot be plotted)."""
  parser = argparse.ArgumentParser(prog="python -m jaxdp.plot", description=__doc__.splitlines()[0])
  parser.add_argument("workdirs", nargs="+", metavar="WORKDIR", help="run directories holding metrics.jsonl")
  parser.add_argument("--helpfull", action="help", help="the same as --help (as jaxdp's other tools accept)")
  parser.add_argument("--out", help=f"PNG path (default: WORKDIR/{DEFAULT_NAME} for one run, ./{DEFAULT_NAME})")
  args = parser.parse_args(argv)
  out = args.out or (os.path.join(args.workdirs[0], DEFAULT_NAME) if len(args.workdirs) == 1 else DEFAULT_NAME)
  return cli.guarded(lambda: print(plot(args.workdirs, out)))


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
