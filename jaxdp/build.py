"""Config -> the pieces of a run: backend, dataset, model, optimizer, state constructor, mapped steps.

Shared by the training loop (jaxdp.train) and the compiler inspection (jaxdp.inspect).
"""

import dataclasses
import functools
from collections.abc import Callable

import jax
import ml_collections
import optax

from jaxdp import config as config_lib
from jaxdp import data, models, optim, parallel
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


def build(config: ml_collections.ConfigDict) -> Parts:
  """Validates `config` and builds its parts; raises ConfigError naming any bad value."""
  num_devices = config.parallel.get("num_devices", 0) or jax.device_count()
  layout = config_lib.validate(config, num_devices, jax.process_count())
  ds = data.load(config.dataset)
  options = step_lib.StepOptions.from_config(config, num_devices, cast_inputs=not ds.integer_inputs)
  backend = parallel.make_backend(config.parallel.backend, config.parallel.get("num_devices", 0),
                                  options.shard_optimizer_state, checked=not options.invariant)
  model = models.get_model(config.model, ds.input_shape, ds.num_classes)
  tx = optim.make(config)
  init = functools.partial(step_lib.init_state, jax.random.PRNGKey(config.seed), model=model, tx=tx,
                           options=options)
  backend.bind_state(jax.eval_shape(init))
  train_step = backend.map_train(functools.partial(step_lib.train_step, model=model, tx=tx, options=options))
  eval_step = backend.map_eval(functools.partial(step_lib.eval_step, model=model, options=options))
  return Parts(config, layout, backend, ds, model, tx, init, train_step, eval_step)
