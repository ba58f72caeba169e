"""A config's names as a run's objects (`resolve`) and, on its `DataParallel`, their steps (`build`, for the tools)."""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxdp import checkpoint, data, models, objects, optim, parallel, strategies, tasks
from jaxdp import config as config_lib
from jaxdp import step as step_lib
from jaxdp.batch import REAL
from jaxdp.config import ConfigError
from jaxdp.library import DataParallel
from jaxdp.report import metrics
from jaxdp.tasks import base as task_lib


@dataclasses.dataclass
class Resolved:
  """The objects a config names (or a caller passed instead), checked against each other."""
  config: ml_collections.ConfigDict
  layout: config_lib.Layout
  ds: data.Dataset
  model: models.Model
  tx: optax.GradientTransformation
  task: tasks.Task = step_lib.CLASSIFICATION  # What is learned: the loss and metrics of a batch (`tasks.get`).
  task_info: tasks.Resolved | None = None     # The task's name and why it runs, for the start summary.
  named: ml_collections.ConfigDict | None = None  # The config as checkpoints store it (`objects.Objects.named`).

  @property
  def cast_inputs(self) -> bool:
    """Whether float inputs reach the model in the compute dtype (not for token ids)."""
    return not self.ds.integer_inputs

  @property
  def headline(self) -> tuple[str, ...]:
    """The metrics the progress line shows (`tasks.headline`)."""
    return tasks.headline(self.task)


@dataclasses.dataclass
class Parts(Resolved):
  """A resolved config on its `DataParallel`: the state's constructor and the compiled steps."""
  dp: Any = None  # library.DataParallel.from_config(named)
  init: Callable[[], step_lib.TrainState] | None = None  # Deterministic fresh state (to be placed by the backend).
  train_step: Callable | None = None  # Mapped and jitted: (state, (block, index)) -> (state, metrics); donated.
  eval_step: Callable | None = None   # Mapped and jitted: (state, device batch) -> metric sums.

  @property
  def backend(self) -> parallel.Backend:
    return self.dp.backend

  @property
  def strategy(self) -> strategies.Strategy:
    return self.dp.strategy


def resolve(config: ml_collections.ConfigDict, num_devices: int | None = None, *, model: Any = None, task: Any = None,
            train_data: Any = None, eval_data: Any = None,
            optimizer: optax.GradientTransformation | None = None) -> Resolved:
  """Validates `config` for `num_devices` (default: `parallel.num_devices`, else all) and resolves its names, the
  objects given overriding them; ConfigError names any bad value."""
  config = config_lib.with_defaults(config)
  num_devices = num_devices or config.parallel.num_devices or jax.device_count()
  layout = config_lib.validate(config, num_devices, jax.process_count())
  strategies.select(config).validate(config, layout)
  # Data objects only when given: a data.load without those parameters still serves named datasets.
  given = {k: v for k, v in (("train_data", train_data), ("eval_data", eval_data)) if v is not None}
  ds = data.load(config.dataset, **given)
  facts = ds.corpus.facts
  task_info = tasks.resolve(config, facts, task, functools.partial(_first_targets, ds, config.dataset))
  num_outputs = getattr(task_info.task, "num_outputs", None)
  module = {"module": model} if model is not None else {}
  net = models.get_model(config.model, ds.input_shape, num_outputs(facts) if num_outputs else ds.num_classes, **module,
                         task=task_info.task, element_spec=ds.element_spec())  # A linen instance: init on what the task feeds.
  shapes = jax.eval_shape(net.init, jax.random.PRNGKey(config.seed))[0]
  tx = optim.make(config, shapes, optimizer)  # The decay mask from the true shapes.
  named = objects.Objects(model, task, train_data, eval_data, optimizer).named(config)
  resolved = Resolved(config, layout, ds, net, tx, task_info.task, task_info, named)
  checkpoint.check_best(config, _traced_metrics(ds, {"model": net, "task": task_info.task,
                                                     "cast_inputs": resolved.cast_inputs}))
  return resolved


def build(config: ml_collections.ConfigDict, devices: list[jax.Device] | None = None, **given: Any) -> Parts:
  """`resolve` on `DataParallel.from_config` over `devices` (default: all, or `parallel.num_devices`), with steps."""
  config = config_lib.with_defaults(config)
  run = resolve(config, len(devices) if devices else None, **given)
  dp = DataParallel.from_config(run.named, devices)
  init = dp.prepare(run.model, run.tx, seed=config.seed)
  fields = {f.name: getattr(run, f.name) for f in dataclasses.fields(Resolved)}
  return Parts(**fields, dp=dp, init=init, train_step=dp.train_step(run.task, cast_inputs=run.cast_inputs),
               eval_step=dp.eval_step(run.task, cast_inputs=run.cast_inputs))


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
