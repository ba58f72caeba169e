"""Framework overhead: jaxdp's train step against a minimal hand-written `jax.jit` step, on 1 and 2 devices.

    python benchmarks/overhead.py [--devices 1,2] [--workloads cnn,mlp] [--rounds 41] [--steps 3] \
        [--real_devices] [--out benchmarks/results/overhead.md]

The contenders train the same model with the same optimizer on the same global batch, over the same
mesh, donate their state, and are fed the same device-resident batch:
  jaxdp     `parallel.make_backend("mesh", n).map_train(step.train_step)`: jit(shard_map) with an
            explicit `lax.pmean` of the gradients, NaN/Inf guard, loss and accuracy metrics;
  baseline  `jax.jit` of loss -> grad -> optax update over the global batch with in/out shardings
            (state replicated, batch sharded) and donation; XLA's partitioner inserts the all-reduce.
  unguarded jaxdp's step with its NaN guard's predicate constant (XLA drops the branch): what the guard costs
            (docs/design-notes.md#nan-guard).
Contenders alternate every round (A B A B ...); each round yields one median step time per
contender; the ratios jaxdp / baseline are taken per round and reported as median [interquartile range].
"""

import sys

from jaxdp.runtime import cpu_devices

REAL_DEVICES = "--real_devices"  # The machine's own devices (an accelerator), not 2 simulated CPU devices.
if __name__ == "__main__" and REAL_DEVICES not in sys.argv:  # Before JAX starts its backends.
  cpu_devices.simulate(2)

import argparse  # noqa: E402
import functools  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402

from jaxdp import models, optim, parallel, strategies  # noqa: E402
from jaxdp import step as step_lib  # noqa: E402
from jaxdp.configs import default  # noqa: E402

TARGET = 1.02  # jaxdp / baseline step time (issue 14).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # --clock: what a step's "time" is.
# name -> (model fields, input shape, global batch): the default config's CNN on digits-shaped data,
# and the MLP 784-1024-1024-10 of the PyTorch comparison.
WORKLOADS: dict[str, tuple[dict, tuple[int, ...], int]] = {
    "cnn": ({"name": "cnn"}, (8, 8, 1), 128),
    "mlp": ({"name": "mlp", "hidden": (1024, 1024)}, (28, 28, 1), 256),
}
NUM_CLASSES = 10


def setup(workload: str, num_devices: int) -> dict[str, Any]:
  """Model, optimizer, backend and one device-resident batch for `workload` on `num_devices` devices."""
  fields, shape, batch = WORKLOADS[workload]
  config = default.get_config()
  config.model.update(fields)
  config.batch_size = batch
  model = models.get_model(config.model, shape, NUM_CLASSES)
  tx = optim.make(config)
  backend = parallel.make_backend("mesh", num_devices)
  rng = np.random.default_rng(0)
  host = {"inputs": rng.standard_normal((batch, *shape)).astype(np.float32),
          "labels": rng.integers(0, NUM_CLASSES, batch).astype(np.int32)}
  options = strategies.StrategyOptions.from_config(config, num_devices)  # As jaxdp.build.
  return {"model": model, "tx": tx, "backend": backend, "batch": backend.put_batch(host),
          "item": backend.put_step(host), "options": options}


class Stepper:
  """A contender that threads the (donated) state through `step(state, batch)`; `state` is the latest."""

  clock: Callable[[], float] = time.perf_counter  # Set from --clock.

  def __init__(self, step: Callable, state: Any, batch: Any):
    self.step, self.state, self.batch = step, state, batch

  def _call(self) -> Any:
    self.state, out = self.step(self.state, self.batch)
    return self.state, out

  def __call__(self, n: int) -> list[float]:
    return abrun.time_steps(self._call, n, jax.block_until_ready, Stepper.clock)


def jaxdp_contender(env: dict[str, Any], step_fn: Callable | None = None) -> Stepper:
  """jaxdp's own pieces: backend.init, backend.map_train(step), the device batch; `step_fn` None: jaxdp's step
  with the config's options."""
  model, tx, backend = env["model"], env["tx"], env["backend"]
  if step_fn is None:
    step_fn = functools.partial(step_lib.train_step, strategy=strategies.DataParallel(env["options"]))
  init = functools.partial(step_lib.init_state, jax.random.PRNGKey(0), model=model, tx=tx)
  backend.bind_state(jax.eval_shape(init))
  state = backend.init(init)
  train = backend.map_train(functools.partial(step_fn, model=model, tx=tx))
  return Stepper(train, state, env["item"])  # What a jaxdp step takes: a block of one step and its index.


class Unguarded(strategies.DataParallel):
  """Plain data parallelism whose finite check always passes: XLA compiles the update without its branch."""

  def finite(self, loss: jax.Array, grads: Any, axis: Any) -> jax.Array:
    del loss, grads, axis
    return jnp.bool_(True)


def baseline_contender(env: dict[str, Any]) -> Stepper:
  """A minimal hand-written data-parallel step: plain jax.jit with shardings and donation, no shard_map."""
  model, tx, mesh = env["model"], env["tx"], env["backend"].mesh
  replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

  def init() -> tuple[Any, Any]:
    params, _ = model.init(jax.random.split(jax.random.PRNGKey(0))[0])  # As step.init_state: the same start.
    return params, tx.init(params)

  _, model_state = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  assert not jax.tree.leaves(model_state), "the baseline is for models without state (no BatchNorm)"

  def train(state: tuple[Any, Any], batch: dict[str, jax.Array]) -> tuple[tuple[Any, Any], jax.Array]:
    params, opt_state = state

    def loss_fn(p: Any) -> jax.Array:
      logits, _ = model.apply(p, {}, batch["inputs"], train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)  # The mean over the global batch: XLA all-reduces.
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  state = jax.jit(init, out_shardings=replicated)()
  step = jax.jit(train, in_shardings=(replicated, sharded), out_shardings=(replicated, replicated),
                 donate_argnums=0)
  return Stepper(step, state, env["batch"])


def measure(workload: str, num_devices: int, rounds: int, steps: int) -> dict[str, list[float]]:
  """Per-round median step times of jaxdp and the baseline, alternating."""
  env = setup(workload, num_devices)
  contenders = {
      "jaxdp": jaxdp_contender(env),
      "baseline": baseline_contender(env),
      "unguarded": jaxdp_contender(env, functools.partial(step_lib.train_step, strategy=Unguarded(env["options"]))),
  }
  return abrun.alternate(contenders, rounds, steps)


def report(results: dict[tuple[str, int], dict[str, list[float]]], args: argparse.Namespace,
           load_before: float) -> list[str]:
  """Markdown: header, then per workload and device count the step times and ratios."""
  dev = jax.devices()[0]
  lines = abrun.header("Framework overhead: jaxdp step vs a hand-written jax.jit step", load_before,
                       f"{jax.device_count()} x {dev.platform} ({dev.device_kind})"
                       f"{'' if args.real_devices else ', fake devices sharing the cores'}; jax {jax.__version__}")
  lines += [f"{args.rounds} rounds; each round runs every contender for {args.steps} steps (after 3 warm-up "
            "steps), one after the other; step times are that round's median, ratios are per round; shown "
            f"as median [interquartile range] over rounds; clock: {args.clock}. Target: jaxdp / baseline <= "
            f"{TARGET}.", "",
            "| workload | devices | jaxdp ms | baseline ms | **jaxdp / baseline** | target met | unguarded / baseline |",
            "| --- " * 7 + "|"]
  for (workload, n), r in results.items():
    fields, shape, batch = WORKLOADS[workload]
    main = abrun.ratios(r["jaxdp"], r["baseline"])
    met = "yes" if abrun.spread(main)["median"] <= TARGET else "**no**"
    lines.append(f"| {workload} {shape}, batch {batch} | {n} | {abrun.fmt_ms(r['jaxdp'])} | "
                 f"{abrun.fmt_ms(r['baseline'])} | **{abrun.fmt_iqr(main)}** | {met} | "
                 f"{abrun.fmt_iqr(abrun.ratios(r['unguarded'], r['baseline']))} |")
  return lines


def main(argv: list[str]) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--devices", default="1,2", help="comma-separated device counts (at most 2)")
  p.add_argument(REAL_DEVICES, action="store_true", help="run on the machine's devices (e.g. a GPU), not 2 "
                 "simulated CPU devices")
  p.add_argument("--workloads", default="cnn,mlp", help=f"comma-separated, from {', '.join(WORKLOADS)}")
  p.add_argument("--rounds", type=int, default=41)
  p.add_argument("--steps", type=int, default=3, help="timed steps per contender and round")
  p.add_argument("--out", default=None, help="write the results (markdown) here")
  p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                 help="wall: elapsed time; cpu: the process's CPU time (all threads), steadier on a busy machine")
  args = p.parse_args(argv)
  Stepper.clock = CLOCKS[args.clock]
  load_before = abrun.load()
  results = {(w, int(n)): measure(w, int(n), args.rounds, args.steps)
             for w in args.workloads.split(",") for n in args.devices.split(",")}
  abrun.write(args.out, report(results, args, load_before))


if __name__ == "__main__":
  main(sys.argv[1:])
