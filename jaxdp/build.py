"""Config -> the pieces of a run: backend, dataset, model, optimizer, gradient strategy, state constructor,
mapped steps.

Shared by the training loop (jaxdp.loop.train) and the tools (jaxdp.tools: inspect, topology, evaluate, ...).
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxdp import checkpoint, data, feed, models, objects, optim, parallel, strategies, tasks
from jaxdp import config as config_lib
from jaxdp import step as step_lib
from jaxdp.batch import REAL
from jaxdp.config import ConfigError
from jaxdp.report import metrics
from jaxdp.strategies import zero1_check
from jaxdp.tasks import base as task_lib


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
  task: tasks.Task = step_lib.CLASSIFICATION  # What is learned: the loss and metrics of a batch (`tasks.get`).
  task_info: tasks.Resolved | None = None     # The task's name and why it runs, for the start summary.

  @functools.cached_property
  def steps_per_block(self) -> int:
    """Train steps per host-to-device transfer (`jaxdp.feed`); at first use, as it reads the train split's spec."""
    return feed.steps_per_block(self.ds, self.layout.process_batch)


def build(config: ml_collections.ConfigDict, devices: list[jax.Device] | None = None, *, model: Any = None,
          task: Any = None, train_data: Any = None, eval_data: Any = None,
          optimizer: optax.GradientTransformation | None = None) -> Parts:
  """Validates `config` and builds its parts; raises ConfigError naming any bad value.

  `devices`: build over these instead of `jax.devices()` (e.g. a TPU topology's, to compile ahead of time).
  `model` (an NNX/linen module class or instance), `task` (a function or task object) and `train_data`/
  `eval_data` (arrays or random-access sources) and `optimizer` (any optax GradientTransformation) are objects
  from Python overriding the config's names.
  """
  config = config_lib.with_defaults(config)
  num_devices = len(devices) if devices else config.parallel.num_devices or jax.device_count()
  layout = config_lib.validate(config, num_devices, jax.process_count())
  strategy_cls = strategies.select(config)
  strategy_cls.validate(config, layout)
  backend = parallel.make_backend(config.parallel.backend, config.parallel.num_devices, strategy_cls, devices=devices)
  # Data objects only when given: a data.load without those parameters still serves named datasets.
  given = {k: v for k, v in (("train_data", train_data), ("eval_data", eval_data)) if v is not None}
  ds = data.load(config.dataset, **given)
  strategy = strategy_cls(strategies.StrategyOptions.from_config(config, num_devices))
  facts = ds.corpus.facts
  task_info = tasks.resolve(config, facts, task, functools.partial(_first_targets, ds, config.dataset))
  num_outputs = getattr(task_info.task, "num_outputs", None)
  module = {"module": model} if model is not None else {}
  net = models.get_model(config.model, ds.input_shape, num_outputs(facts) if num_outputs else ds.num_classes, **module,
                         task=task_info.task, element_spec=ds.element_spec())  # A linen instance: init on what the task feeds.
  shapes = jax.eval_shape(net.init, jax.random.PRNGKey(config.seed))[0]
  tx = optim.make(config, shapes, optimizer)  # The decay mask from the true shapes.
  _check_sharded(strategy, tx, shapes, objects.shown(config.optimizer if optimizer is None else optimizer))
  init = functools.partial(step_lib.init_state, jax.random.PRNGKey(config.seed), model=net, tx=tx,
                           strategy=strategy)
  abstract = jax.eval_shape(init)
  backend.bind_state(abstract, strategy.state_specs(abstract))
  learn = {"model": net, "task": task_info.task, "cast_inputs": not ds.integer_inputs}
  checkpoint.check_best(config, _traced_metrics(ds, learn))
  replica_step = functools.partial(step_lib.train_step, tx=tx, strategy=strategy, **learn)
  train_step = backend.map_train(replica_step)
  eval_step = backend.map_eval(functools.partial(step_lib.eval_step, strategy=strategy, **learn))
  accumulates = strategy.options.accum_steps > 1
  flops_step = backend.map_train(_loop_free(replica_step, strategy)) if accumulates else train_step
  return Parts(config, layout, backend, ds, net, tx, init, train_step, eval_step, strategy, flops_step,
               task_info.task, task_info)


def _check_sharded(strategy: strategies.Strategy, tx: optax.GradientTransformation, shapes: Any, name: str) -> None:
  """A ConfigError naming the optimizer `name` when ZeRO-1 shards the state of one that is not elementwise."""
  why = strategy.shards_state and tx is not optim.NONE and zero1_check.refusal(tx, shapes, strategy.options.num_shards)
  if why:
    raise ConfigError(f"optimizer {name} cannot run under parallel.shard_optimizer_state (ZeRO-1), which updates "
                      f"each device's slice of a parameter alone: {why}")


def _first_targets(ds: data.Dataset, dataset: ml_collections.ConfigDict, rows: int = 64) -> np.ndarray:
  """Up to `rows` targets of the train split (else the eval split) in stored order: the same in every process."""
  for split in dict.fromkeys((dataset.train_split, dataset.eval_split)):
    try:  # An eval-only run (in-memory eval_data) has no train split to read.
      batch = next(iter(data.eval_batches(ds, split, global_batch=rows, process_index=0, process_count=1)))
    except (ConfigError, StopIteration):
      continue
    return np.asarray(batch["labels"])[batch[REAL]] if "labels" in batch else np.zeros(0)
  return np.zeros(0)


def eval_metrics(ds: data.Dataset, *, model: models.Model, task: tasks.Task, cast_inputs: bool) -> list[str]:
  """The names `eval/...` the task reports, from tracing it (no FLOP run) on one abstract example of `ds`."""
  params, model_state = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  batch = {k: jax.ShapeDtypeStruct((1, *v.shape), v.dtype) for k, v in ds.element_spec().items()}

  def sums(params: Any, model_state: Any, batch: dict) -> dict:
    bound = task_lib.BoundModel(model.apply, params, model_state, train=False, rng=None, dtype=jnp.float32,
                                cast_inputs=cast_inputs)
    return task_lib.per_row(task_lib.run(task, bound, batch), jnp.ones((1,), bool))

  shapes = jax.eval_shape(sums, params, model_state, batch)
  ones = {group: jax.tree.map(lambda _: 1.0, values) for group, values in shapes.items()}
  return list(metrics.summarize_eval(ones, task))


def _traced_metrics(ds: data.Dataset, learn: dict[str, Any]) -> list[str]:
  """`eval_metrics`; a task that reads a feature the data left out is a ConfigError naming it and why."""
  try:
    return eval_metrics(ds, **learn)
  except KeyError as e:
    left_out = ds.corpus.facts.left_out
    key = e.args[0] if e.args else None
    if key not in left_out:
      raise
    raise ConfigError(f"the task reads feature {key!r}, which batches leave out: {left_out[key]} (they hold "
                      f"{', '.join(ds.element_spec())})") from None


def _loop_free(replica_step: functools.partial, strategy: strategies.Strategy) -> Callable:
  """The same step with one micro-batch of the whole slice: the same FLOPs, with no loop for XLA to count once."""
  whole = type(strategy)(dataclasses.replace(strategy.options, accum_steps=1))
  return functools.partial(replica_step, strategy=whole)
