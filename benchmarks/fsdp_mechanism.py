"""FSDP's two mechanisms compiled side by side: jaxdp's explicit gathers under shard_map against jit with the
parameters' NamedShardings (the JAX training cookbook's way: the compiler inserts the collectives).

    python benchmarks/fsdp_mechanism.py [--workloads mlp4x2048] [--rounds 7] [--steps 3] \
        [--topology v5e:2x4] [--out benchmarks/results/fsdp_mechanism.md]

The same model, Adam, global batch, mesh and state layout (`fsdp.param_specs`, the optimizer state mirroring it) for:
  ddp       jaxdp's plain step: parameters replicated, one all-reduce of the gradient (for reference);
  shard_map jaxdp's FSDP step (`parallel.shard_params`): per-leaf all-gathers inside the loss, re-gathered in the
            backward pass, reduce-scatters from `grad` (docs/design-notes.md#fully-sharded-data-parallelism);
  jit       a global-view `jax.jit` step over the same sharded state, batch P('data'): cross-entropy mean over
            the global batch, grad, Adam; the compiler (Shardy/GSPMD) chooses the collectives;
  jit+act   the same with each layer's activations held batch-sharded (`with_sharding_constraint`), as MaxText
            writes its models: the compiler must then gather the weights, not the activations.
For each: XLA's compiled memory per device (`jaxdp.tools.hlo.memory`) and the compiled collectives by kind (count,
tensor bytes); on 8 simulated CPU devices also step times in alternating rounds (median [IQR] of per-round ratios
to shard_map). `--topology NAME` compiles the same contenders ahead of time for a TPU slice with libtpu (no timing).
"""

import sys

from jaxdp.runtime import cpu_devices

if __name__ == "__main__":  # Before JAX starts its backends.
  cpu_devices.simulate(8)

import argparse  # noqa: E402
import functools  # noqa: E402
import os  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402
import overhead  # noqa: E402

from jaxdp import models, parallel, strategies  # noqa: E402
from jaxdp import step as step_lib  # noqa: E402
from jaxdp.configs import default  # noqa: E402
from jaxdp.tools import hlo  # noqa: E402

NUM_CLASSES = 10
# name -> (model fields, input shape, global batch).
WORKLOADS: dict[str, tuple[dict, tuple[int, ...], int]] = {
    "mlp4x2048": ({"name": "mlp", "hidden": (2048,) * 4}, (8, 8, 1), 256),
    "mlp4x512": ({"name": "mlp", "hidden": (512,) * 4}, (8, 8, 1), 4096),
    "mlp20x16384": ({"name": "mlp", "hidden": (16_384,) * 20}, (8, 8, 1), 64),
}
CONTENDERS = ("ddp", "shard_map", "jit", "jit+act")


class Setup:
  """One workload on `devices`: model, Adam, options, and the state's abstract shapes."""

  def __init__(self, workload: str, devices: list[jax.Device]):
    name, _, batch = workload.partition(":")  # NAME[:GLOBAL_BATCH]
    fields, self.shape, self.batch = WORKLOADS[name]
    self.batch, self.hidden = int(batch or self.batch), fields["hidden"]
    config = default.get_config()
    config.model.update(fields)
    config.batch_size = self.batch
    self.model, self.tx = models.get_model(config.model, self.shape, NUM_CLASSES), optax.adam(1e-3)
    self.devices = devices
    self.options = strategies.StrategyOptions.from_config(config, len(devices))
    self.init = functools.partial(step_lib.init_state, jax.random.PRNGKey(0), model=self.model, tx=self.tx)
    self.mesh = parallel.make_backend("mesh", 0, devices=devices).mesh

  def host_batch(self) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"inputs": rng.standard_normal((self.batch, *self.shape)).astype(np.float32),
            "labels": rng.integers(0, NUM_CLASSES, self.batch).astype(np.int32)}


def jaxdp_step(s: Setup, strategy: strategies.Strategy) -> tuple[Callable, Any, Any, parallel.Backend]:
  """jaxdp's mapped step under `strategy`, its abstract state and step input (a block of one step)."""
  backend = parallel.make_backend("mesh", 0, type(strategy), devices=s.devices)
  init = functools.partial(s.init, strategy=strategy)
  abstract = jax.eval_shape(init)
  backend.bind_state(abstract, strategy.state_specs(abstract))
  train = backend.map_train(functools.partial(step_lib.train_step, model=s.model, tx=s.tx, strategy=strategy))
  spec = {"inputs": jax.ShapeDtypeStruct(s.shape, np.float32), "labels": jax.ShapeDtypeStruct((), np.int32)}
  return train, backend.abstract_global(abstract), backend.abstract_item(spec, s.batch, 1), backend


def jit_step(s: Setup, constrain: bool) -> tuple[Callable, Any, Any, Callable]:
  """A global-view jit step over the FSDP layout; `constrain`: activations held batch-sharded. Its abstract state and
  batch, and its state constructor (laid out in place)."""
  strategy = strategies.FSDP(s.options)
  init = functools.partial(s.init, strategy=strategy)
  abstract = jax.eval_shape(init)
  shardings = jax.tree.map(lambda x: NamedSharding(s.mesh, x), strategy.state_specs(abstract))
  rows = NamedSharding(s.mesh, P("data"))
  apply = s.model.apply
  if constrain:
    apply = functools.partial(_constrained_apply, rows)

  def train(state: step_lib.TrainState, batch: dict[str, jax.Array]) -> tuple[step_lib.TrainState, jax.Array]:
    def loss_fn(params: Any) -> jax.Array:
      logits, _ = apply(params, state.model_state, batch["inputs"], train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = s.tx.update(grads, state.opt_state, state.params)
    return state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                         opt_state=opt_state), loss

  step = jax.jit(train, in_shardings=(shardings, rows), out_shardings=(shardings, NamedSharding(s.mesh, P())),
                 donate_argnums=0)
  state = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), abstract, shardings)
  batch = {"inputs": jax.ShapeDtypeStruct((s.batch, *s.shape), np.float32, sharding=rows),
           "labels": jax.ShapeDtypeStruct((s.batch,), np.int32, sharding=rows)}
  return step, state, batch, jax.jit(init, out_shardings=shardings)


def _constrained_apply(rows: NamedSharding, params: Any, model_state: Any, inputs: jax.Array,
                       train: bool) -> tuple[jax.Array, Any]:
  """jaxdp's MLP (`models/mlp.py`) written out over its parameters, each activation held batch-sharded."""
  del train
  hold = functools.partial(jax.lax.with_sharding_constraint, shardings=rows)
  x = hold(inputs.reshape(inputs.shape[0], -1))
  for i in sorted(params["hidden"]):
    x = hold(jax.nn.relu(x @ params["hidden"][i]["kernel"] + params["hidden"][i]["bias"]))
  return hold(x @ params["head"]["kernel"] + params["head"]["bias"]), model_state


def build(s: Setup) -> dict[str, dict[str, Any]]:
  """Each contender's step, abstract inputs, and (for running) its state constructor and device batch maker."""
  out = {}
  for name, strategy in (("ddp", strategies.DataParallel(s.options)), ("shard_map", strategies.FSDP(s.options))):
    train, state, item, backend = jaxdp_step(s, strategy)
    out[name] = {"step": train, "state": state, "input": item,
                 "make": functools.partial(backend.init, functools.partial(s.init, strategy=strategy)),
                 "put": backend.put_step}
  for name, constrain in (("jit", False), ("jit+act", True)):
    train, state, batch, init = jit_step(s, constrain)
    out[name] = {"step": train, "state": state, "input": batch, "make": init,
                 "put": lambda host: jax.device_put(host, NamedSharding(s.mesh, P("data")))}
  return out


def compiled_figures(c: dict[str, Any], n: int) -> dict[str, Any]:
  """XLA's per-device memory and the compiled collectives (count, tensor bytes) of one contender's step."""
  lowered = c["step"].lower(c["state"], c["input"])
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:  # libtpu refuses a program over HBM: its message gives a lower bound.
    from jaxdp.report import summary
    from jaxdp.tools import topology
    short = topology._out_of_memory(str(e), summary.tree_bytes(c["state"]) + summary.tree_bytes(c["input"]))
    if short is None:
      raise
    return {"memory": {"total_bytes": short[0], "lower_bound": True}, "collectives": {}, "fits": False}
  ops, _ = hlo.parse_compiled(compiled.as_text() or "", n)
  kinds = {k: {"count": t["count"], "tensor_bytes": t["tensor_bytes"], "in_loop": t["in_loop"]}
           for k, t in hlo.tally(ops).items() if t["count"]}
  return {"memory": hlo.memory(compiled), "collectives": kinds, "fits": True}


def figures_table(figures: dict[str, dict[str, Any]], params_bytes: int) -> list[str]:
  """Markdown rows: memory per device and collectives per step of each contender."""
  mib = lambda b: f"{b / 2**20:,.1f}"  # noqa: E731
  lines = ["| contender | total MiB/device | arguments | temporaries | collectives: count (tensor bytes / parameter "
           "bytes) | all bytes / parameter bytes |", "| --- " * 6 + "|"]
  for name, f in figures.items():
    mem, coll = f["memory"], f["collectives"]
    if mem.get("lower_bound"):
      lines.append(f"| {name} | >= {mib(mem['total_bytes'])} (does not fit: libtpu's lower bound) | | | | |")
      continue
    kinds = ", ".join(_kind(k, c, params_bytes) for k, c in coll.items())
    moved = sum(c["tensor_bytes"] for c in coll.values()) / params_bytes
    lines.append(f"| {name} | {mib(mem['total_bytes'])} | {mib(mem['argument_bytes'])} | {mib(mem['temp_bytes'])} | "
                 f"{kinds} | {moved:.2f}x |")
  return lines


def one_step_agreement(s: Setup, built: dict[str, dict[str, Any]]) -> dict[str, float]:
  """Each contender's parameters after one step from the same start, as relative L2 distance to shard_map's."""
  host, params = s.host_batch(), {}
  for name, c in built.items():
    state, _ = c["step"](c["make"](), c["put"](host))
    params[name] = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(state.params)])
  ref = params["shard_map"]
  return {name: float(np.linalg.norm(p - ref) / np.linalg.norm(ref)) for name, p in params.items()}


def _kind(kind: str, c: dict[str, int], params_bytes: int) -> str:
  """`all-gather 9 (1.00x)`; ops inside a loop body run once per iteration but count once: said, as a lower bound."""
  looped = f"; {c['in_loop']} in loops, bytes counted once" if c["in_loop"] else ""
  return f"{kind} {c['count']} ({c['tensor_bytes'] / params_bytes:.2f}x{looped})"


def timed(s: Setup, built: dict[str, dict[str, Any]], rounds: int, steps: int) -> dict[str, list[float]]:
  """Per-round median step times of every contender, alternating, each on its own state and device batch."""
  host = s.host_batch()
  return abrun.alternate({name: overhead.Stepper(c["step"], c["make"](), c["put"](host)) for name, c in built.items()},
                         rounds, steps)


def main(argv: list[str]) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workloads", default="mlp4x2048,mlp4x512",
                 help=f"comma-separated NAME[:GLOBAL_BATCH], NAME from {', '.join(WORKLOADS)}")
  p.add_argument("--rounds", type=int, default=7)
  p.add_argument("--steps", type=int, default=3, help="timed steps per contender and round")
  p.add_argument("--topology", default=None, help="compile for this TPU slice with libtpu instead (no timing)")
  p.add_argument("--out", default=None, help="write the results (markdown) here")
  args = p.parse_args(argv)
  load_before = abrun.load()
  if args.topology:
    from jaxdp.tools import topology
    devices = topology.devices(args.topology)
  else:
    devices = jax.devices()
  dev = devices[0]
  lines = abrun.header("FSDP mechanisms: explicit gathers under shard_map vs jit with NamedSharding", load_before,
                       f"{len(devices)} x {dev.platform} ({dev.device_kind}), "
                       + ("compiled ahead of time with libtpu" if args.topology else "fake devices sharing the cores")
                       + f"; jax {jax.__version__}")
  for workload in args.workloads.split(","):
    s = Setup(workload, devices)
    built = build(s)
    params_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(jax.eval_shape(s.init).params))
    figures = {name: compiled_figures(c, len(devices)) for name, c in built.items()}
    lines += ["", f"**{workload}**: MLP {s.hidden}, input {s.shape}, global batch {s.batch}, Adam; "
              f"parameters {params_bytes / 2**20:,.1f} MiB; collectives' tensor bytes as multiples of the "
              "parameter bytes (scalars left out)", "", *figures_table(figures, params_bytes)]
    if not args.topology:
      agree = one_step_agreement(s, built)
      lines += ["", "Parameters after one step from the same start, relative L2 distance to shard_map's: "
                + ", ".join(f"{name} {d:.1e}" for name, d in agree.items() if name != "shard_map") + "."]
      r = timed(s, built, args.rounds, args.steps)
      lines += ["", f"{args.rounds} rounds of {args.steps} steps per contender (after 3 warm-up steps); step ms: "
                "median [IQR] of the rounds' medians; ratios to shard_map per round, median [IQR].", "",
                "| contender | step ms | / shard_map |", "| --- | --- | --- |"]
      lines += [f"| {name} | {abrun.fmt_ms(t)} | {abrun.fmt_iqr(abrun.ratios(t, r['shard_map']))} |"
                for name, t in r.items()]
  abrun.write(args.out, lines)


if __name__ == "__main__":
  main(sys.argv[1:])
