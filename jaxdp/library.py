"""`jaxdp.DataParallel`: jaxdp's data parallelism for a loop of your own, as PyTorch DDP or Accelerate wrap one.

It owns the devices, the mesh and the gradient strategy (plain, invariant, ZeRO-1); the user keeps the loop.
`init`, `batches`, `train_step`, `evaluate`, `save`/`restore` are the trainer's own pieces (`step`, `data`,
`checkpoint`, `loop.evaluate`); `@dp.step` with `dp.value_and_grad` serves loops `train_step` does not fit.
"""

import collections
import functools
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import linen, nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxdp import checkpoint, feed, objects, parallel, strategies
from jaxdp import data as datalib
from jaxdp import config as config_lib
from jaxdp import step as step_lib
from jaxdp.config import ConfigError
from jaxdp.loop import evaluate as evaluate_lib
from jaxdp.loop import step_metrics
from jaxdp.models import adapter
from jaxdp.runtime import process
from jaxdp.tasks import base as task_lib

PyTree = Any


class DataParallel:
  """The devices (all of every process, or the first `num_devices` of one), their mesh and a gradient strategy.

  `invariant`: bitwise the same training on any power-of-two device count; `shard_optimizer_state`: ZeRO-1.
  `dataset`: `config.dataset` fields for the data it reads by name (`data_dir=...`). In a process of a
  multi-process run (`python -m jaxdp.launch -- my_loop.py`, or a configured cluster) it joins the run first.
  """

  def __init__(self, *, num_devices: int = 0, invariant: bool = False, shard_optimizer_state: bool = False,
               grad_accum_steps: int = 1, dtype: str = "float32", allreduce_dtype: str = "float32",
               max_grad_norm: float = 0.0, invariant_shards: int = 8, **dataset: Any):
    config = config_lib.with_defaults(ml_collections.ConfigDict())
    config.update(grad_accum_steps=grad_accum_steps, dtype=dtype, max_grad_norm=max_grad_norm)
    config.parallel.update(num_devices=num_devices, invariant=invariant, shard_optimizer_state=shard_optimizer_state,
                           allreduce_dtype=allreduce_dtype, invariant_shards=invariant_shards)
    unknown = sorted(set(dataset) - set(config.dataset))
    if unknown:
      raise ConfigError(f"DataParallel got unknown options {unknown} (dataset fields: {', '.join(config.dataset)})")
    config.dataset.update(dataset)
    process.join(config)
    self.config = config
    self._strategy_cls = strategies.select(config)
    self.backend = parallel.make_backend("mesh", num_devices, self._strategy_cls)
    self.strategy = self._strategy_cls(strategies.StrategyOptions.from_config(config, self.backend.num_devices))
    self.model: adapter.Model | None = None
    self.tx: optax.GradientTransformation | None = None
    self._datasets: dict[Any, tuple[Any, datalib.Dataset]] = {}
    self._eval_steps: dict[int, tuple[Any, Callable]] = {}  # By task: compiled once per `init`, not per eval.
    self._stream: dict | None = None    # The stream spec of the last `batches`: saved with each checkpoint.
    self._restored: dict | None = None  # The stream spec the restored checkpoint was trained on.
    self._given: dict[str, Any] = {}  # The objects a checkpoint's config names (`objects.Objects`).

  @property
  def num_devices(self) -> int:
    return self.backend.num_devices

  def init(self, model: Any, optimizer: optax.GradientTransformation, *, seed: int = 0,
           inputs: Any = None) -> step_lib.TrainState:
    """A `TrainState` on the devices from an NNX module (class built with `rngs` only, or instance) or a linen
    module (initialized on `inputs`, a sample batch), and any optax optimizer; `train_step` uses both."""
    self.model, self.tx, self._eval_steps = _model(model, inputs), optimizer, {}
    self._given.update(model=model, optimizer=optimizer)
    init = functools.partial(step_lib.init_state, jax.random.PRNGKey(seed), model=self.model, tx=optimizer,
                             strategy=self.strategy)
    abstract = jax.eval_shape(init)
    self.backend.bind_state(abstract, self.strategy.state_specs(abstract))
    return self.backend.init(init)

  def replicate(self, tree: PyTree) -> PyTree:
    """Host values (the same in every process) as arrays replicated on every device: a state for `@dp.step`."""
    sharding = NamedSharding(self.backend.mesh, P())
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, jnp.asarray(x)), tree)

  def batches(self, data: Any, *, batch_size: int, seed: int = 0, start_step: int = 0, stop_step: int | None = None,
              split: str | None = None) -> feed.Feeder:
    """This process's rows of global batches `start_step`, ... (`stop_step`: excluded; None: forever), placed
    ahead on the devices by a thread (`jaxdp.feed`; `close()` stops it, as does dropping the iterator).

    `data`: a dataset name, a dict of numpy arrays or a random-access source; one global order of `seed`, so
    the batches are the same on any device and process count. After `restore`, a stream other than the
    checkpoint's (seed, batch size, data) is refused: resuming would replay or skip examples.
    """
    ds, split = self._open(data, split, train=True)
    self._check_batch(batch_size, self.strategy.options.accum_steps)
    spec = datalib.stream_spec(ds, split, seed=seed, global_batch=batch_size)
    if self._restored is not None and start_step:
      datalib.check_resume(self._restored, spec)
    self._stream = spec
    host = datalib.train_batches(ds, split, seed=seed, global_batch=batch_size, start_step=start_step,
                              process_index=jax.process_index(), process_count=jax.process_count(), stop_step=stop_step)
    return feed.Feeder(self.backend, host, feed.steps_per_block(ds, batch_size // jax.process_count()),
                       self.config.parallel.prefetch)

  def train_step(self, task: Callable = step_lib.CLASSIFICATION) -> Callable:
    """The compiled `(state, batch) -> (state, metrics)` for `task(model, batch) -> (loss, metrics)`: the loss and
    every mean metric Σw·v/Σw over the global batch (`step.train_step`); `state` is donated."""
    self._check_init()
    if task is not step_lib.CLASSIFICATION:  # The default is what an empty task.name infers: nothing to name.
      self._given["task"] = task
    return self._bounded(self.backend.map_train(functools.partial(
        step_lib.train_step, model=self.model, tx=self.tx, strategy=self.strategy, task=task)))

  def evaluate(self, state: step_lib.TrainState, task: Callable, data: Any, *, batch_size: int,
               split: str | None = None) -> dict[str, float]:
    """`eval/<metric>` and `eval/num_examples` over every example of the data (its eval split) exactly once."""
    self._check_init()
    ds, split = self._open(data, split, train=False)
    self._check_batch(batch_size, 1)
    if id(task) not in self._eval_steps:  # The task kept with it, so that its id is never another's.
      self._eval_steps[id(task)] = task, self.backend.map_eval(functools.partial(
          step_lib.eval_step, model=self.model, strategy=self.strategy, task=task))
    return evaluate_lib.exact(self.backend, self._eval_steps[id(task)][1], task, ds, split, batch_size, state)

  def save(self, workdir: str, state: step_lib.TrainState, *, metrics: dict[str, float] | None = None) -> int:
    """Writes `state` as WORKDIR/checkpoints/<its step> with the stream of the last `batches`; returns the step."""
    step = int(self.backend.get(state.step))
    named = objects.Objects(**self._given).named(self.config)  # So `jaxdp.evaluate` says which object to pass.
    # Leaving the `with` closes the checkpointer, which waits for the background write: `save` returns with it done.
    with checkpoint.Checkpointer(workdir, named, stream=self._stream) as saver:
      saver.save(step, state, self.backend, metrics, force=True)
    return step

  def restore(self, workdir: str, state: step_lib.TrainState, step: int | None = None) -> tuple[Any, int]:
    """(the checkpoint `step` of WORKDIR, default the newest, laid out as `state`, its step), or (`state`, 0)
    when there is none; ConfigError when it does not fit `state`."""
    with checkpoint.Checkpointer(workdir, self.config) as saver:
      step = saver.latest_step() if step is None else step
      if step is None:
        return state, 0
      self._restored = saver.stored_meta(step).get("stream")
      return saver.restore_or_init(self.backend, lambda: state, step, self.strategy), step

  def step(self, fn: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]]) -> Callable:
    """`fn(state, batch) -> (state, metrics)` run on every device (state replicated, batch sharded), compiled,
    `state` donated; take gradients in it with `dp.value_and_grad` only. Returned values must be replicated."""
    if self.strategy.shards_state:
      raise ConfigError("@dp.step takes a replicated state; shard_optimizer_state (ZeRO-1) serves dp.train_step")
    mapped = jax.shard_map(parallel.select(fn), mesh=self.backend.mesh, in_specs=(P(), (P(None, parallel.AXIS), P())),
                           out_specs=P(), check_vma=self.backend.checked)
    return self._bounded(jax.jit(mapped, donate_argnums=0))

  def _bounded(self, step: Callable) -> Callable:
    """`step`, which waits for the oldest of its unfinished calls beyond `steps_in_flight` (CPU only): simulated CPU
    devices deadlock in their collectives when hundreds of steps are queued (docs/design-notes.md#steps-in-flight)."""
    limit = step_metrics.steps_in_flight(self.backend)
    if not limit:
      return step
    pending: collections.deque = collections.deque()

    @functools.wraps(step)
    def bounded(state: PyTree, batch: PyTree) -> Any:
      out = step(state, batch)
      # A metric: never donated by the next call, as the state is. A step that returns none is not bounded.
      pending.extend(jax.tree.leaves(out[1])[:1] if isinstance(out, tuple) and len(out) == 2 else [])
      while len(pending) > limit:
        pending.popleft().block_until_ready()
      return out

    return bounded

  def value_and_grad(self, loss_fn: Callable[..., Any]) -> Callable[..., tuple[jax.Array, PyTree]]:
    """Inside `@dp.step`: `loss_fn(params, batch, *args)` -> per-example losses [B] (or a `tasks.Metric` with
    weights) becomes `(params, batch, *args) -> (loss, grads)` over the GLOBAL batch: Σw·ℓ/Σw and its gradient,
    reduced across devices by the strategy (micro-batches: grad_accum_steps), the same on every device."""
    def reduced(params: PyTree, batch: PyTree, *args: Any) -> tuple[jax.Array, PyTree]:
      def grad_fn(params: PyTree, model_state: PyTree, micro: PyTree, rng: jax.Array) -> tuple:
        def total(params: PyTree) -> tuple[jax.Array, dict]:
          sums = task_lib.by_kind({"loss": task_lib.as_metric("loss", loss_fn(params, micro, *args))})
          return sums["mean"]["loss"], sums
        (loss, sums), grads = jax.value_and_grad(total, has_aux=True)(params)
        return (loss, (sums, model_state)), grads

      # The strategy marks the parameters varying itself (`DataAxis.vary`): `grad` then stays local and its
      # reduction is the only one, never N times the gradient.
      holder = types.SimpleNamespace(params=params, model_state={})  # What a strategy reads of a state.
      sums, _, grads = self.strategy.gradients(grad_fn, holder, batch, jax.random.PRNGKey(0), self.backend.axis)
      weight = sums["weight"]["loss"]
      inverse = 1 / jnp.where(weight > 0, weight, 1)  # One reciprocal, then products, as `step.train_step`.
      return task_lib.means(sums)["loss"], jax.tree.map(lambda g: g * inverse, grads)

    return reduced

  def _open(self, data: Any, split: str | None, train: bool) -> tuple[datalib.Dataset, str]:
    """The dataset of a name or of data objects (opened once per object) and the split to read."""
    key = (data if isinstance(data, str) else id(data), train)
    if key not in self._datasets:
      config = ml_collections.ConfigDict(self.config.dataset.to_dict())
      if isinstance(data, str):
        config.name = self.config.dataset.name = data
        ds = datalib.load(config)
      else:
        ds = datalib.load(config, **{"train_data" if train else "eval_data": data})
        self._given["train_data" if train else "eval_data"] = data
      self._datasets[key] = (data, ds)  # The object kept with it, so that its id is never another's.
    ds = self._datasets[key][1]
    return ds, split or (self.config.dataset.train_split if train else self.config.dataset.eval_split)

  def _check_batch(self, batch_size: int, accum: int) -> None:
    """Raises ConfigError naming a batch size the devices (and strategy) cannot split."""
    layout = config_lib.Layout(self.num_devices, jax.process_count(), batch_size, batch_size)
    if not isinstance(batch_size, int) or batch_size < 1 or batch_size % (self.num_devices * accum):
      raise ConfigError(f"batch_size ({batch_size!r}) must be divisible by the number of devices ({self.num_devices})"
                        f" x grad_accum_steps ({accum})")
    config = ml_collections.ConfigDict(self.config.to_dict())
    config.update(batch_size=batch_size, grad_accum_steps=accum)
    self._strategy_cls.validate(config, layout)

  def _check_init(self) -> None:
    if self.model is None:
      raise ConfigError("call dp.init(model, optimizer) first: the step needs the model and the optimizer")


def _model(model: Any, inputs: Any) -> adapter.Model:
  """An NNX module (class or instance) or a linen module as jaxdp's pure `Model`."""
  if isinstance(model, nnx.Module):
    return adapter.from_nnx_instance(model)
  if isinstance(model, type) and issubclass(model, nnx.Module):
    return adapter.from_nnx(model, {})
  if isinstance(model, linen.Module):
    if inputs is None:
      raise ConfigError(f"a linen module ({type(model).__name__}) is initialized on inputs: dp.init(..., inputs=x)")
    return adapter.from_linen(model, jnp.asarray(inputs))
  raise ConfigError(f"model {model!r} is not a Flax NNX module (a class or an instance) or a linen module instance")
