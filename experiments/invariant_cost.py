"""What the device-count-invariant mode costs in step time: jaxdp's plain step against its invariant
step (fixed micro-shards, ordered tree sum via all-gather), same model, optimizer, global batch and
devices, fed the same device-resident batch; alternating rounds.

    python experiments/invariant_cost.py --devices 8 --rounds 15 --out experiments/invariant_cost.md
"""

import os
import sys

from jaxdp.runtime import cpu_devices

if __name__ == "__main__":  # Before JAX is imported: XLA reads XLA_FLAGS once.
  cpu_devices.simulate(8)

import argparse  # noqa: E402
import functools  # noqa: E402

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402

from jaxdp import models, optim, parallel, strategies  # noqa: E402
from jaxdp import step as step_lib  # noqa: E402
from jaxdp.configs import default  # noqa: E402

INPUT_SHAPE, BATCH = (8, 8, 1), 128  # The default config's digits-shaped inputs and global batch.


def contender(model_name: str, n: int, invariant: bool) -> abrun.Contender:
  """Runs `steps` train steps of the plain or invariant step on `n` devices; returns step seconds."""
  config = default.get_config()
  config.model = ml_collections.ConfigDict({"name": model_name})
  options = strategies.StrategyOptions(num_shards=n, invariant_shards=8)
  strategy = (strategies.Invariant if invariant else strategies.DataParallel)(options)
  model = models.get_model(config.model, INPUT_SHAPE, 10)
  tx = optim.make(config)
  backend = parallel.make_backend("mesh", n, type(strategy))
  init = functools.partial(step_lib.init_state, jax.random.PRNGKey(0), model=model, tx=tx, strategy=strategy)
  backend.bind_state(jax.eval_shape(init))
  step = backend.map_train(functools.partial(step_lib.train_step, model=model, tx=tx, strategy=strategy))
  rng = np.random.RandomState(0)
  batch = backend.put_batch({"inputs": rng.rand(BATCH, *INPUT_SHAPE).astype(np.float32),
                             "labels": rng.randint(0, 10, BATCH).astype(np.int32)})
  holder = {"state": backend.init(init)}

  def one() -> dict:
    holder["state"], metrics = step(holder["state"], batch)
    return metrics

  return lambda steps: abrun.time_steps(one, steps, jax.block_until_ready)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--models", default="cnn,mlp")
  parser.add_argument("--rounds", type=int, default=15)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  load_before = abrun.load()
  rows = []
  for name in args.models.split(","):
    times = abrun.alternate({"plain": contender(name, args.devices, False),
                             "invariant": contender(name, args.devices, True)}, args.rounds, args.steps)
    rows.append(f"| {name} | {abrun.fmt_ms(times['plain'])} | {abrun.fmt_ms(times['invariant'])} | "
                f"**{abrun.fmt(abrun.ratios(times['invariant'], times['plain']))}** |")
  lines = abrun.header("Cost of the device-count-invariant mode", load_before, f"{args.devices} simulated CPU devices")
  lines += [f"Global batch {BATCH}, 8 fixed micro-shards, Adam; {args.rounds} alternating rounds of {args.steps} steps;"
            " per-round median step times, then per-round ratios.", "",
            "| model | plain ms/step | invariant ms/step | invariant / plain |", "| --- | --- | --- | --- |", *rows, "",
            "The invariant step runs its micro-shards one after another and all-gathers N gradient copies "
            "(N x the bytes of one all-reduce's payload) to sum them in a fixed order. Fake CPU devices share "
            "two cores, so the ratio here says little about accelerators."]
  abrun.write(args.out, lines)


if __name__ == "__main__":
  main()
