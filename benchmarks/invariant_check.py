"""Invariant mode, bitwise on 1 and 2 devices: the built-in CNN trained a few steps on one fixed batch in invariant
mode on each count, its parameters compared bit for bit (docs/parallelism.md#invariant-mode). On GPUs the steps
compile with XLA's deterministic ops (`Invariant.compiler_options`); where only one device exists, two runs on it.

    python benchmarks/invariant_check.py --out invariant.json        # the machine's own devices
    python benchmarks/invariant_check.py --cpu_devices 2 --out ...   # 2 simulated CPU devices (a dry run)
"""

import sys

from jaxdp.runtime import cpu_devices

if __name__ == "__main__" and "--cpu_devices" in sys.argv:  # Before JAX starts its backends.
  cpu_devices.simulate(int(sys.argv[sys.argv.index("--cpu_devices") + 1]))

import argparse  # noqa: E402
import functools  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxdp import models, optim, parallel, strategies  # noqa: E402
from jaxdp import step as step_lib  # noqa: E402
from jaxdp.configs import default  # noqa: E402

SHAPE, CLASSES, BATCH = (8, 8, 1), 10, 64


def train(num_devices: int, steps: int) -> str:
  """The sha256 of the CNN's parameters after `steps` invariant steps on `num_devices` devices."""
  config = default.get_config()
  config.model.name, config.batch_size, config.parallel.invariant = "cnn", BATCH, True
  model, tx = models.get_model(config.model, SHAPE, CLASSES), optim.make(config)
  backend = parallel.make_backend("mesh", num_devices, strategies.Invariant)
  strategy = strategies.Invariant(strategies.StrategyOptions.from_config(config, num_devices))
  init = functools.partial(step_lib.init_state, jax.random.PRNGKey(0), model=model, tx=tx, strategy=strategy)
  backend.bind_state(jax.eval_shape(init))
  state = backend.init(init)
  step = backend.map_train(functools.partial(step_lib.train_step, model=model, tx=tx, strategy=strategy))
  rng = np.random.default_rng(0)
  item = backend.put_step({"inputs": rng.standard_normal((BATCH, *SHAPE)).astype(np.float32),
                           "labels": rng.integers(0, CLASSES, BATCH).astype(np.int32)})
  for _ in range(steps):
    state, _ = step(state, item)
  digest = hashlib.sha256()
  for leaf in jax.tree.leaves(backend.get(state.params)):
    digest.update(np.ascontiguousarray(leaf).tobytes())
  return digest.hexdigest()


def main(argv: list[str]) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--cpu_devices", type=int, default=0, help="simulated CPU devices (set before JAX starts)")
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  counts = (1, 2) if jax.device_count() >= 2 else (1, 1)
  digests = [train(n, args.steps) for n in counts]
  result = {"platform": jax.default_backend(), "device": jax.devices()[0].device_kind, "devices_compared": counts,
            "steps": args.steps, "compiler_options": strategies.Invariant.compiler_options(jax.default_backend()),
            "bitwise": digests[0] == digests[1], "digests": digests}
  print(json.dumps(result))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
  return result


if __name__ == "__main__":
  sys.exit(0 if main(sys.argv[1:])["bitwise"] else 1)
