"""What a step's batch costs to make, on the host and on the device, for a split held in memory (jaxdp.resident).

    python experiments/resident_gather.py [--rows 1024] [--examples 60000] [--shape 28,28,1] [--rounds 7] [--calls 50]

Three ways to a device batch of `--rows` random rows of a float32 split of `--examples` x `--shape` (the four-way
MLP's by default): `host` the numpy gather alone (what the host pays before a transfer), `host+put` the gather and
`jax.device_put` of it, waited for (what each step's batch cost before the split was held), and `device` a jitted
`jnp.take` of the same rows from the split placed once (what a step pays now, inside it). Rounds alternate the
three; each times `--calls` batches of fresh random rows. Prints median (min..max) ms per batch over rounds.
Results: resident.md.
"""

import argparse
import statistics
import sys
import time

import numpy as np

import abrun


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=1024)
  parser.add_argument("--examples", type=int, default=60_000)
  parser.add_argument("--shape", default="28,28,1")
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--calls", type=int, default=50)
  args = parser.parse_args(argv)
  import jax
  import jax.numpy as jnp
  shape = tuple(int(d) for d in args.shape.split(","))
  rng = np.random.default_rng(0)
  split = rng.random((args.examples, *shape), np.float32)
  on_device = jax.device_put(split)
  take = jax.jit(lambda a, i: jnp.take(a, i, axis=0, mode="clip"))

  def rows() -> np.ndarray:
    return rng.permutation(args.examples)[:args.rows].astype(np.int32)

  ways = {"host": lambda i: split[i], "host+put": lambda i: jax.block_until_ready(jax.device_put(split[i])),
          "device": lambda i: jax.block_until_ready(take(on_device, jax.device_put(i)))}
  for way in ways.values():
    way(rows())  # Compile and warm up.
  times: dict[str, list[float]] = {name: [] for name in ways}
  for r in range(args.rounds):
    for name in abrun.in_turn(list(ways), r):
      ids = [rows() for _ in range(args.calls)]
      began = time.perf_counter()
      for i in ids:
        ways[name](i)
      times[name].append((time.perf_counter() - began) / args.calls * 1e3)
  mb = args.rows * int(np.prod(shape)) * 4 / 2**20
  print(f"{args.rows} rows of {shape} float32 ({mb:.1f} MiB) from {args.examples:,}; {args.rounds} rounds x "
        f"{args.calls} batches; ms per batch, median (min..max)")
  for name, values in times.items():
    print(f"  {name:9s} {statistics.median(values):.3f} ({min(values):.3f}..{max(values):.3f})")


if __name__ == "__main__":
  main(sys.argv[1:])
