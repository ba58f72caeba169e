"""Config -> the pieces of a run: backend, dataset, model, optimizer, gradient strategy, state constructor,
mapped steps.

Shared by the training loop (jaxdp.train) and the compiler inspection (jaxdp.inspect).
"""

import dataclasses
import functools
import importlib
from collections.abc import Callable

import jax
import ml_collections
import optax

from jaxdp import config as config_lib
from jaxdp import data, models, optim, parallel, strategies
from jaxdp import step as step_lib

# How gradients are reduced and applied: the first strategy whose `config.parallel` flag is set, else
# plain data parallelism; "module.Class" under jaxdp/strategies/. A new strategy is one module there
# and one line here.
STRATEGIES: tuple[tuple[str, str], ...] = (
    ("invariant", "invariant.Invariant"),
    ("shard_optimizer_state", "zero1.ZeRO1"),
)
DEFAULT_STRATEGY = "plain.DataParallel"


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
  strategy: strategies.Strategy | None = None  # How gradients cross devices (see STRATEGIES).
  flops_step: Callable | None = None  # train_step without the accumulation loop, only for counting FLOPs.


def strategy_class(config: ml_collections.ConfigDict) -> type[strategies.Strategy]:
  """The gradient strategy the config asks for (`config.parallel.<flag>`, see STRATEGIES)."""
  path = next((path for flag, path in STRATEGIES if config.parallel.get(flag, False)), DEFAULT_STRATEGY)
  module, name = path.rsplit(".", 1)
  return getattr(importlib.import_module(f"jaxdp.strategies.{module}"), name)


def build(config: ml_collections.ConfigDict, devices: list[jax.Device] | None = None) -> Parts:
  """Validates `config` and builds its parts; raises ConfigError naming any bad value.

  `devices`: build over these instead of `jax.devices()` (e.g. a TPU topology's, to compile ahead of time).
  """
  config = config_lib.with_defaults(config)
  num_devices = len(devices) if devices else config.parallel.get("num_devices", 0) or jax.device_count()
  layout = config_lib.validate(config, num_devices, jax.process_count())
  strategy_cls = strategy_class(config)
  backend = parallel.make_backend(config.parallel.backend, config.parallel.get("num_devices", 0),
                                  strategy_cls.shards_state, checked=strategy_cls.checked, devices=devices)
  ds = data.load(config.dataset)
  options = step_lib.StepOptions.from_config(config, num_devices, cast_inputs=not ds.integer_inputs)
  strategy = strategy_cls(options)
  model = models.get_model(config.model, ds.input_shape, ds.num_classes)
  tx = optim.make(config, jax.eval_shape(model.init, jax.random.PRNGKey(config.seed))[0])  # Mask from true shapes.
  init = functools.partial(step_lib.init_state, jax.random.PRNGKey(config.seed), model=model, tx=tx,
                           strategy=strategy)
  abstract = jax.eval_shape(init)
  backend.bind_state(abstract, strategy.state_specs(abstract))
  train_step = backend.map_train(functools.partial(step_lib.train_step, model=model, tx=tx, strategy=strategy))
  eval_step = backend.map_eval(functools.partial(step_lib.eval_step, model=model, strategy=strategy))
  return Parts(config, layout, backend, ds, model, tx, init, train_step, eval_step, strategy,
               _flops_step(backend, model, tx, strategy) if options.accum_steps > 1 else train_step)


def _flops_step(backend: parallel.Backend, model: models.Model, tx: optax.GradientTransformation,
                strategy: strategies.Strategy) -> Callable:
  """The same step with one micro-batch of the whole slice: the same FLOPs, with no loop for XLA to count once."""
  whole = type(strategy)(dataclasses.replace(strategy.options, accum_steps=1))
  return backend.map_train(functools.partial(step_lib.train_step, model=model, tx=tx, strategy=whole))
