"""jaxdp's train step on a held split (the gather inside the step) against the same step on a placed batch, in one
process, on the four-way study's MLP (784-1024-1024-10, batch 1024, on its synthetic .npz).

    python experiments/resident_step_ab.py [--rounds 12] [--repeats 10] [--tmp /tmp/resident_step_ab]

Both sides are `build.build(config).feed.train_step` of the same config, `parallel.resident_mb` 1024 (held: a block
of row ids and the split on the device) or 0 (one host batch, placed once). Rounds alternate the order (A B, B A,
...); each times `--repeats` calls, process CPU seconds (all threads) and wall. Prints medians (min..max) and the
per-round ratio held / batch (> 1: the held step slower). What the loop adds around the step is four_way.py's
split; this is the step alone. Results: resident.md.
"""

import argparse
import os
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402
import four_way  # noqa: E402
import four_way_configs  # noqa: E402


def side(tmp: str, resident_mb: float) -> Callable[[int], None]:
  """`run(n)`: n of jaxdp's train steps on what its loop would place for the first step, waited for."""
  config = four_way_configs.get_config("mlp")
  config.dataset.name, config.dataset.data_dir = os.path.join(tmp, "mlp.npz"), os.path.join(tmp, "tfds")
  config.num_train_steps, config.parallel.resident_mb = 300, resident_mb
  return abrun.jaxdp_stepping(config)


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=12)
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--tmp", default="/tmp/resident_step_ab", help="The .npz and its TFDS preparation.")
  args = parser.parse_args(argv)
  os.makedirs(args.tmp, exist_ok=True)
  if not os.path.exists(os.path.join(args.tmp, "mlp.npz")):
    four_way.synthetic("mlp", four_way.EXAMPLES["mlp"], os.path.join(args.tmp, "mlp.npz"))
  sides = {"held": side(args.tmp, 1024), "batch": side(args.tmp, 0)}
  times = abrun.cpu_wall(sides, args.rounds, args.repeats)
  print(f"load {os.getloadavg()[0]:.1f}; {args.rounds} rounds x {args.repeats} calls; ms per step")
  print("\n".join(abrun.cpu_wall_lines(times, "held", "batch")))

if __name__ == "__main__":
  main(sys.argv[1:])
