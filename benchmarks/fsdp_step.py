"""FSDP against plain DDP: jaxdp's train step with `parallel.shard_params` and without, on 8 simulated devices.

    python benchmarks/fsdp_step.py [--devices 8] [--workloads mlp] [--rounds 11] [--steps 3] [--real_devices] \
        [--out benchmarks/results/fsdp_step.md]

Both contenders are jaxdp's step (`backend.map_train(step.train_step)`) on the same model, optimizer (Adam), global
batch and mesh, fed the same device-resident batch: `ddp` all-reduces the gradient of replicated parameters;
`fsdp` holds 1/N of parameters and optimizer state, all-gathers each parameter inside the loss (again in the
backward pass) and reduce-scatters its gradient (docs/design-notes.md#fully-sharded-data-parallelism). On one
device (`--real_devices` on one GPU) nothing is sharded: the ratio is what the FSDP code path costs there.
Contenders alternate every round; ratios fsdp / ddp are per round, reported as median [interquartile range].
"""

import sys

from jaxdp.runtime import cpu_devices

REAL_DEVICES = "--real_devices"
if __name__ == "__main__" and REAL_DEVICES not in sys.argv:  # Before JAX starts its backends.
  cpu_devices.simulate(8)

import argparse  # noqa: E402
import functools  # noqa: E402
import os  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402
import overhead  # noqa: E402

from jaxdp import parallel, strategies  # noqa: E402
from jaxdp import step as step_lib  # noqa: E402

WORKLOADS = {**overhead.WORKLOADS, "mlp4x2048": ({"name": "mlp", "hidden": (2048,) * 4}, (8, 8, 1), 256)}


def contender(env: dict[str, Any], strategy: strategies.Strategy) -> overhead.Stepper:
  """jaxdp's step under `strategy`, on its own backend (FSDP's is unchecked), state laid out as it says."""
  model, tx = env["model"], optax.adam(1e-3)
  backend = parallel.make_backend("mesh", strategy.options.num_shards, type(strategy))
  init = functools.partial(step_lib.init_state, jax.random.PRNGKey(0), model=model, tx=tx, strategy=strategy)
  abstract = jax.eval_shape(init)
  backend.bind_state(abstract, strategy.state_specs(abstract))
  train = backend.map_train(functools.partial(step_lib.train_step, model=model, tx=tx, strategy=strategy))
  return overhead.Stepper(train, backend.init(init), env["item"])


def measure(workload: str, num_devices: int, rounds: int, steps: int) -> dict[str, list[float]]:
  """Per-round median step times of plain DDP and FSDP, alternating."""
  overhead.WORKLOADS.update(WORKLOADS)
  env = overhead.setup(workload, num_devices)
  options = env["options"]
  return abrun.alternate({"ddp": contender(env, strategies.DataParallel(options)),
                          "fsdp": contender(env, strategies.FSDP(options))}, rounds, steps)


def main(argv: list[str]) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--devices", default="8", help="comma-separated device counts")
  p.add_argument(REAL_DEVICES, action="store_true", help="the machine's devices (e.g. one GPU), none simulated")
  p.add_argument("--workloads", default="mlp,mlp4x2048", help=f"comma-separated, from {', '.join(WORKLOADS)}")
  p.add_argument("--rounds", type=int, default=11)
  p.add_argument("--steps", type=int, default=3, help="timed steps per contender and round")
  p.add_argument("--out", default=None, help="write the results (markdown) here")
  args = p.parse_args(argv)
  load_before = abrun.load()
  dev = jax.devices()[0]
  lines = abrun.header("FSDP (shard_params) vs plain DDP: jaxdp's step", load_before,
                       f"{jax.device_count()} x {dev.platform} ({dev.device_kind})"
                       f"{'' if args.real_devices else ', fake devices sharing the cores'}; jax {jax.__version__}")
  lines += [f"{args.rounds} rounds of {args.steps} steps per contender; Adam; step times are each round's "
            "median, ratios per round, shown as median [interquartile range] over rounds.", "",
            "| workload | devices | ddp ms | fsdp ms | **fsdp / ddp** |", "| --- " * 5 + "|"]
  for workload in args.workloads.split(","):
    for n in map(int, args.devices.split(",")):
      r = measure(workload, n, args.rounds, args.steps)
      _, shape, batch = WORKLOADS[workload]
      lines.append(f"| {workload} {shape}, batch {batch} | {n} | {abrun.fmt_ms(r['ddp'])} | "
                   f"{abrun.fmt_ms(r['fsdp'])} | **{abrun.fmt_iqr(abrun.ratios(r['fsdp'], r['ddp']))}** |")
  abrun.write(args.out, lines)


if __name__ == "__main__":
  main(sys.argv[1:])
