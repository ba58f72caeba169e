"""Config -> the pieces of a run: backend, dataset, model, optimizer, gradient strategy, state constructor,
mapped steps.

Shared by the training loop (jaxdp.loop.train) and the tools (jaxdp.tools: inspect, topology, evaluate, ...).
"""

import dataclasses
import functools
from collections.abc import Callable

import jax
import ml_collections
import optax

from jaxdp import config as config_lib
from jaxdp import data, models, optim, parallel, strategies
from jaxdp import step as step_lib

@dataclasses.dataclass
class Parts:
  """Everything a run is made of, before any state exists on devices."""
  config: ml_collections.ConfigDict
  layout: config_lib.Layout
  backend: parallel.Backend
  ds: data.Dataset
  model: models.Model
  tx: optax.GradientTransformation
  init: Callable[[], step_lib.TrainState]  # Deterministic fresh state (to be placed by the backend).
  train_step: Callable  # Mapped and jitted: (state, device batch) -> (state, metrics); state donated.
  eval_step: Callable   # Mapped and jitted: (state, device batch) -> metric sums.
  strategy: strategies.Strategy | None = None  # How gradients cross devices (`strategies.select`).
  flops_step: Callable | None = None  # train_step without the accumulation loop, only for counting FLOPs.


def build(config: ml_collections.ConfigDict, devices: list[jax.Device] | None = None) -> Parts:
  """Validates `config` and builds its parts; raises ConfigError naming any bad value.

  `devices`: build over these instead of `jax.devices()` (e.g. a TPU topology's, to compile ahead of time).
  """
  config = config_lib.with_defaults(config)
  num_devices = len(devices) if devices else config.parallel.num_devices or jax.device_count()
  layout = config_lib.validate(config, num_devices, jax.process_count())
  strategy_cls = strategies.select(config)
  strategy_cls.validate(config, layout)
  backend = parallel.make_backend(config.parallel.backend, config.parallel.num_devices, strategy_cls, devices=devices)
  ds = data.load(config.dataset)
  strategy = strategy_cls(strategies.StrategyOptions.from_config(config, num_devices))
  task = step_lib.TaskOptions.from_config(config, cast_inputs=not ds.integer_inputs)
  model = models.get_model(config.model, ds.input_shape, ds.num_classes)
  tx = optim.make(config, jax.eval_shape(model.init, jax.random.PRNGKey(config.seed))[0])  # Mask from true shapes.
  init = functools.partial(step_lib.init_state, jax.random.PRNGKey(config.seed), model=model, tx=tx,
                           strategy=strategy)
  abstract = jax.eval_shape(init)
  backend.bind_state(abstract, strategy.state_specs(abstract))
  train_step = backend.map_train(functools.partial(step_lib.train_step, model=model, tx=tx, strategy=strategy,
                                                   task=task))
  eval_step = backend.map_eval(functools.partial(step_lib.eval_step, model=model, strategy=strategy, task=task))
  return Parts(config, layout, backend, ds, model, tx, init, train_step, eval_step, strategy,
               _flops_step(backend, model, tx, strategy, task) if strategy.options.accum_steps > 1 else train_step)


def _flops_step(backend: parallel.Backend, model: models.Model, tx: optax.GradientTransformation,
                strategy: strategies.Strategy, task: step_lib.TaskOptions) -> Callable:
  """The same step with one micro-batch of the whole slice: the same FLOPs, with no loop for XLA to count once."""
  whole = type(strategy)(dataclasses.replace(strategy.options, accum_steps=1))
  return backend.map_train(functools.partial(step_lib.train_step, model=model, tx=tx, strategy=whole, task=task))
