"""One process of the jaxdp side of experiments/ddp_compare.py: jaxdp's mesh backend and train step.

Started by the driver as `taskset -c RANK python experiments/ddp_jaxdp_worker.py` with the environment
`python -m jaxdp.launch` gives each process (JAXDP_COORDINATOR_ADDRESS, JAXDP_NUM_PROCESSES,
JAXDP_PROCESS_ID, JAXDP_CPU_DEVICES=1) and XLA_FLAGS for one thread; joins the run with
`jaxdp.distributed.initialize`, then answers commands on stdin (see ddp_common). Data is a synthetic
batch placed on the device once, so only the train step is timed (as on the PyTorch side). A train
command may ask for variant "no_allreduce": jaxdp's step without its all-reduce (experiments/step_variants.py,
run unchecked), to see what the all-reduce costs inside the step.
"""

import os
import sys

from jaxdp.runtime import cpu_devices

cpu_devices.simulate(cpu_devices.requested([]) or 1)  # Before JAX is imported; keeps the thread flags.

import functools  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_common  # noqa: E402
import step_variants  # noqa: E402

from jaxdp.runtime import distributed  # noqa: E402
from jaxdp import models, optim, parallel, strategies
from jaxdp import step as step_lib  # noqa: E402
from jaxdp.configs import default  # noqa: E402
from jaxdp.strategies import plain  # noqa: E402

# variant "no_allreduce": jaxdp's step (a lax.cond guard) with no collective (see step_variants).
NO_ALLREDUCE = {"guard": "cond", "allreduce": False}


def make_config(name: str, batch: int):
  """The default config with the comparison's model, optimizer and global batch."""
  config = default.get_config()
  config.model.name = name
  config.model.update({k: v for k, v in ddp_common.MODELS[name].items() if k != "input_shape"})
  config.optimizer, config.learning_rate, config.batch_size = "adam", ddp_common.LEARNING_RATE, batch
  return config


class Worker:
  """Builds each (model, batch) once with jaxdp's pieces and times its steps on request."""

  def __init__(self):
    self.backend = parallel.make_backend("mesh")
    self.rank, self.world = jax.process_index(), jax.process_count()
    self.cache: dict = {}

  def handle(self, command: dict) -> dict:
    if command["op"] == "allreduce":
      return self.allreduce(command["model"], command["steps"], command.get("per_leaf", False))
    return {"times": self.train(command["model"], command["batch"], command["steps"], command.get("variant", "jaxdp"))}

  def _model(self, name: str):
    config = make_config(name, 0)
    return config, models.get_model(config.model, ddp_common.MODELS[name]["input_shape"], ddp_common.NUM_CLASSES)

  def _setup(self, name: str, batch: int, variant: str) -> list:
    if (name, batch, variant) not in self.cache:
      config, model = self._model(name)
      config.batch_size = batch
      tx = optim.make(config)
      # As jaxdp.build: the config's strategy options (on CPU one flat gradient all-reduce, parallel.flat_allreduce).
      strategy = strategies.DataParallel(strategies.StrategyOptions.from_config(config, jax.device_count()))
      init = functools.partial(step_lib.init_state, jax.random.PRNGKey(0), model=model, tx=tx, strategy=strategy)
      if variant == "jaxdp":
        backend, step = self.backend, functools.partial(step_lib.train_step, strategy=strategy)
      else:  # Unchecked: without the all-reduce the replicas' states differ, which a checked shard_map rejects.
        backend = parallel.make_backend("mesh", checked=False)
        step = functools.partial(step_variants.train_step, **NO_ALLREDUCE)
      backend.bind_state(jax.eval_shape(init))
      train = backend.map_train(functools.partial(step, model=model, tx=tx))
      x, y = ddp_common.local_batch(name, batch, self.rank, self.world)
      device_batch = backend.put_batch({"inputs": x, "labels": y})
      self.cache[name, batch, variant] = [train, backend.init(init), device_batch]
    return self.cache[name, batch, variant]

  def train(self, name: str, batch: int, steps: int, variant: str) -> list[float]:
    entry = self._setup(name, batch, variant)
    train, state, device_batch = entry
    times = []
    for _ in range(steps):
      start = time.perf_counter()
      state, metrics = train(state, device_batch)
      jax.block_until_ready((state, metrics))
      times.append(time.perf_counter() - start)
    entry[1] = state  # The old state was donated.
    return times

  def allreduce(self, name: str, steps: int, per_leaf: bool = False) -> dict:
    """The gradient all-reduce of jaxdp's step alone, on a gradient-shaped tree: one flat buffer as the step
    does across processes (`plain.flat_all_reduce_mean`), or with `per_leaf` one collective per leaf."""
    _, model = self._model(name)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))[0]
    mesh = self.backend.mesh
    local = jax.tree.map(lambda p: np.ones((1, *p.shape), p.dtype), params)  # This process's gradients.
    sharding = NamedSharding(mesh, P(parallel.AXIS))
    grads = jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), local)
    mean = plain.all_reduce_mean if per_leaf else plain.flat_all_reduce_mean
    reduce = jax.jit(jax.shard_map(lambda t: mean(jax.tree.map(lambda x: x[0], t), parallel.AXIS),
                                   mesh=mesh, in_specs=P(parallel.AXIS), out_specs=P()))
    jax.block_until_ready(reduce(grads))  # Compile.
    times = []
    for _ in range(steps):
      start = time.perf_counter()
      jax.block_until_ready(reduce(grads))
      times.append(time.perf_counter() - start)
    return {"times": times, "bytes": sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))}


def main() -> None:
  distributed.initialize(default.get_config())  # Multi-process when the launcher's variables are set.
  ddp_common.serve(Worker().handle)


if __name__ == "__main__":
  main()
