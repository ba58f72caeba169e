"""Does asynchronous checkpointing slow training? Whole runs of the default config, alternating
A (checkpoint every `checkpoint_every_steps`, the default 200: saves at 200 and 400, the last one
waited for) and B (no checkpoints), in fresh workdirs; the ratio of wall times per round.

    python experiments/checkpoint_overhead.py --rounds 5 --out experiments/checkpoint_overhead.md
"""

import argparse
import atexit
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from jaxdp.runtime import cpu_devices  # noqa: E402

cpu_devices.simulate(8)
# Every run after the first loads its programs from this cache, so compile time does not dilute the ratio.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="ckpt-bench-cache-")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import contextlib  # noqa: E402
import io  # noqa: E402
import time  # noqa: E402

import abrun  # noqa: E402

from jaxdp import train  # noqa: E402
from jaxdp.configs import default  # noqa: E402


def run_seconds(checkpoint_every: int, data_dir: str | None) -> float:
  """Wall seconds of one whole training run of the default config."""
  config = default.get_config()
  config.dataset.data_dir = data_dir
  config.checkpoint_every_steps = checkpoint_every
  start = time.perf_counter()
  with contextlib.redirect_stdout(io.StringIO()), tempfile.TemporaryDirectory(prefix="ckpt-bench-") as workdir:
    train.train_and_evaluate(config, workdir)
  return time.perf_counter() - start


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--data_dir", default=None)
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  load_before = abrun.load()
  interval = default.get_config().checkpoint_every_steps
  run_seconds(interval, args.data_dir)  # Warm-up: prepares data, fills the compilation cache.
  times: dict[str, list[float]] = {"A": [], "B": []}
  for _ in range(args.rounds):
    times["A"].append(run_seconds(interval, args.data_dir))
    times["B"].append(run_seconds(0, args.data_dir))
  ratio = abrun.ratios(times["A"], times["B"])
  lines = abrun.header("Asynchronous checkpointing overhead", load_before, "8 simulated CPU devices")
  lines += [
      f"Default config (cnn on digits, 400 steps, global batch 128), {args.rounds} rounds of A B.",
      "",
      "| contender | run seconds, median (min..max) |",
      "| --- | --- |",
      f"| A: checkpoint every {interval} steps (async; 2 saves, the last waited for) | {abrun.fmt(times['A'])} |",
      "| B: no checkpoints | " + abrun.fmt(times["B"]) + " |",
      "",
      f"**A / B = {abrun.fmt(ratio)}** (target: at most 1.05).",
  ]
  abrun.write(args.out, lines)


if __name__ == "__main__":
  main()
