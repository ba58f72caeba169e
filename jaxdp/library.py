"""`jaxdp.DataParallel`: the devices, mesh and gradient strategy for any training loop; the trainer's own pieces."""

import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxdp import checkpoint, feed, objects, parallel, strategies, wrap
from jaxdp import data as datalib
from jaxdp import config as config_lib
from jaxdp import step as step_lib
from jaxdp.config import ConfigError
from jaxdp import evaluation as evaluate_lib
from jaxdp.models import adapter
from jaxdp.report import flops as flops_lib
from jaxdp.runtime import process
from jaxdp.strategies import zero1_check

PyTree = Any


class DataParallel:
  """The devices (all of every process, or the first `num_devices` of one), their mesh and a gradient strategy.

  `invariant`: bitwise alike on any power-of-two device count; `shard_optimizer_state`: ZeRO-1; `shard_params`: FSDP.
  `dataset`: `config.dataset` fields for the data it reads by name (`data_dir=...`). In a process of a
  multi-process run (`python -m jaxdp.launch -- my_loop.py`, or a configured cluster) it joins the run first.
  """

  def __init__(self, *, num_devices: int = 0, invariant: bool = False, shard_optimizer_state: bool = False,
               shard_params: bool = False, grad_accum_steps: int = 1, dtype: str = "float32",
               allreduce_dtype: str = "float32", max_grad_norm: float = 0.0, invariant_shards: int = 8, **dataset: Any):
    config = config_lib.with_defaults(ml_collections.ConfigDict())
    config.update(grad_accum_steps=grad_accum_steps, dtype=dtype, max_grad_norm=max_grad_norm)
    config.parallel.update(num_devices=num_devices, invariant=invariant, shard_optimizer_state=shard_optimizer_state,
                           shard_params=shard_params, allreduce_dtype=allreduce_dtype,
                           invariant_shards=invariant_shards)
    unknown = sorted(set(dataset) - set(config.dataset))
    if unknown:
      raise ConfigError(f"DataParallel got unknown options {unknown} (dataset fields: {', '.join(config.dataset)})")
    config.dataset.update(dataset)
    process.join(config)
    self._start(config, None, names_objects=True)

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, devices: list[jax.Device] | None = None) -> "DataParallel":
    """The data parallelism a config describes (strategy, backend, dataset and checkpoint settings), over `devices`
    (default: all, or `parallel.num_devices`); its checkpoints store `config` as given (`objects.Objects.named`)."""
    dp = cls.__new__(cls)
    dp._start(config_lib.with_defaults(config), devices, names_objects=False)
    return dp

  def _start(self, config: ml_collections.ConfigDict, devices: list[jax.Device] | None, names_objects: bool) -> None:
    self.config = config
    self._strategy_cls = strategies.select(config)
    self.backend = parallel.make_backend(config.parallel.backend, config.parallel.num_devices, self._strategy_cls,
                                         devices=devices)
    self.strategy = self._strategy_cls(strategies.StrategyOptions.from_config(config, self.backend.num_devices))
    self.model: adapter.Model | None = None
    self.tx: optax.GradientTransformation | None = None
    self._datasets: dict[Any, tuple[Any, datalib.Dataset]] = {}
    self._eval_steps: dict[tuple[int, bool], tuple[Any, Callable]] = {}  # Compiled once per `init`, not per eval.
    self._train: tuple[functools.partial, Callable] | None = None  # The last train_step: per replica, mapped.
    self._stream: dict | None = None    # The stream spec of the last `batches`: saved with each checkpoint.
    self._train_ds: datalib.Dataset | None = None  # Its dataset: the labels the first train step is checked on.
    self._restored: tuple[str, dict] | None = None  # The restored checkpoint's path and the stream it was trained on.
    self.restored_from: int | None = None  # The step of the checkpoint the last restore read (None: initialized).
    self._savers: dict[str, checkpoint.Checkpointer] = {}  # By workdir: open while saves are in flight.
    self._given: dict[str, Any] | None = {} if names_objects else None  # The objects checkpoints name.

  @property
  def num_devices(self) -> int:
    return self.backend.num_devices

  def prepare(self, model: Any, optimizer: optax.GradientTransformation, *, seed: int = 0,
              inputs: Any = None) -> Callable[[], step_lib.TrainState]:
    """Takes the model and optimizer the steps use and lays out their state; returns its constructor (nothing placed).

    `model`: an NNX module (class built with `rngs` only, or instance), a linen module (initialized on `inputs`, a
    sample batch) or a `jaxdp.models.Model`. Under ZeRO-1 an optimizer that is not elementwise is refused."""
    self.model, self.tx, self._eval_steps, self._train = wrap.model(model, inputs), optimizer, {}, None
    self._name(model=model, optimizer=optimizer)
    init = functools.partial(step_lib.init_state, jax.random.PRNGKey(seed), model=self.model, tx=optimizer,
                             strategy=self.strategy)
    abstract = jax.eval_shape(init)
    self._check_sharded(optimizer, abstract.params)
    self.backend.bind_state(abstract, self.strategy.state_specs(abstract))
    return init

  def init(self, model: Any, optimizer: optax.GradientTransformation, *, seed: int = 0, inputs: Any = None,
           restore: str | None = None) -> step_lib.TrainState:
    """A `TrainState` on the devices (`prepare`'s arguments); `restore`: the newest checkpoint of that workdir
    instead when it has one, the fresh state never made."""
    init = self.prepare(model, optimizer, seed=seed, inputs=inputs)
    return self._restore(restore, init, None)[0] if restore else self.backend.init(init)

  def replicate(self, tree: PyTree) -> PyTree:
    """Host values (the same in every process) copied to every device: a state for `@dp.step`, which donates it."""
    sharding = NamedSharding(self.backend.mesh, P())
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.array(jnp.asarray(x))), tree)

  def batches(self, data: Any, *, batch_size: int, seed: int = 0, start_step: int = 0, stop_step: int | None = None,
              split: str | None = None, on_ids: Callable[[np.ndarray], None] | None = None) -> feed.Feeder:
    """This process's rows of global batches `start_step`, ... (`stop_step`: excluded; None: forever) of `data` (a
    dataset name, a dict of arrays, a random-access source) in one global order of `seed`, the same on any device and
    process count, placed ahead by a thread (`jaxdp.feed`; `close()` stops it). After a restore, a stream other than
    the checkpoint's is refused. `on_ids` is given each batch's example ids (positions in the split) as it is read."""
    ds, split = self._open(data, split, train=True)
    self._check_batch(batch_size, self.strategy.options.accum_steps)
    spec = datalib.stream_spec(ds, split, seed=seed, global_batch=batch_size)
    if self._restored is not None:
      path, stored = self._restored
      try:
        datalib.check_resume(stored, spec)
      except ConfigError as e:
        raise ConfigError(f"checkpoint {path}: {e} (the checkpoint is left untouched)") from None
    self._stream, self._train_ds = spec, ds
    read, finish = feed.uint8_to_devices(ds)  # uint8 inputs placed as uint8, scaled on the devices.
    host = datalib.train_batches(read, split, seed=seed, global_batch=batch_size, start_step=start_step,
                                 process_index=jax.process_index(), process_count=jax.process_count(),
                                 stop_step=stop_step, with_ids=on_ids is not None)
    steps = feed.steps_per_block(ds, rows := batch_size // jax.process_count())
    return feed.Feeder(self.backend, host, steps, self.config.parallel.prefetch, on_ids=on_ids,
                       abstract=self.backend.abstract_item(ds.element_spec(), rows, steps),
                       about=feed.describe(ds, rows, steps, self.config.parallel.prefetch), finish=finish)

  def train_step(self, task: Callable = step_lib.CLASSIFICATION, *, cast_inputs: bool = True) -> Callable:
    """The compiled `(state, batch) -> (state, metrics)` for `task(model, batch) -> (loss, metrics)`: the loss and
    every mean metric Σw·v/Σw over the global batch (`step.train_step`); `state` is donated. `cast_inputs=False`:
    float inputs are token ids, kept exact (not cast to the compute dtype)."""
    self._check_init()
    if task is not step_lib.CLASSIFICATION:  # The default is what an empty task.name infers: nothing to name.
      self._name(task=task)
    replica = functools.partial(step_lib.train_step, model=self.model, tx=self.tx, strategy=self.strategy, task=task,
                                cast_inputs=cast_inputs)
    self._train = replica, self.backend.map_train(replica)
    return wrap.train_step(self._train[1], self.backend,
                           lambda state: wrap.check_outputs(self.model, task, self._train_ds, state, self.backend))

  def flops(self, state: step_lib.TrainState, batches: feed.Feeder) -> float | None:
    """FLOPs per device of one step of the last `train_step` on `batches` (XLA's cost analysis; None where the
    platform has none). Compiles the step as its first call will, which then reuses it."""
    if self._train is None:
      raise ConfigError("dp.flops counts the step of dp.train_step: call it first")
    replica, mapped = self._train
    if self.strategy.options.accum_steps == 1:
      return flops_lib.step_flops(mapped, state, batches.abstract)
    # XLA counts a loop body once: the accumulation loop's FLOPs are counted on one micro-batch of the whole slice,
    # from the program before XLA optimizes it (a compile only to count would cost as much as the step's own).
    whole = copy.copy(self.strategy)  # With its layout (`state_specs`), for one micro-batch.
    whole.options = dataclasses.replace(self.strategy.options, accum_steps=1)
    return flops_lib.lowered_flops(self.backend.map_train(functools.partial(replica, strategy=whole)), state,
                                   batches.abstract)

  def eval_step(self, task: Callable = step_lib.CLASSIFICATION, *, cast_inputs: bool = True) -> Callable:
    """The compiled `(state, batch) -> metric sums` that `evaluate` runs on each batch (`step.eval_step`)."""
    self._check_init()
    key = (id(task), cast_inputs)
    if key not in self._eval_steps:  # The task kept with it, so that its id is never another's.
      self._eval_steps[key] = task, self.backend.map_eval(functools.partial(
          step_lib.eval_step, model=self.model, strategy=self.strategy, task=task, cast_inputs=cast_inputs))
    return self._eval_steps[key][1]

  def evaluate(self, state: step_lib.TrainState, task: Callable, data: Any, *, batch_size: int,
               split: str | None = None) -> dict[str, float]:
    """`eval/<metric>` and `eval/num_examples` over every example of the data (its eval split) exactly once."""
    ds, split = self._open(data, split, train=False)
    self._check_batch(batch_size, 1)
    step = self.eval_step(task, cast_inputs=not ds.integer_inputs)
    return evaluate_lib.exact(self.backend, step, task, ds, split, batch_size, state)

  @staticmethod
  def checkpoints(workdir: str) -> str:
    """WORKDIR/checkpoints, absolute: where `save` writes each step's entry."""
    return checkpoint.directory(workdir)

  def save(self, workdir: str, state: step_lib.TrainState, *, metrics: dict[str, float] | None = None,
           wait: bool = True) -> int:
    """Writes `state` as WORKDIR/checkpoints/<its step> with the stream of the last `batches`; returns the step.
    `metrics` rank the best checkpoints kept; `wait=False` returns while the write goes on (`wait()` waits)."""
    step = int(self.backend.get(state.step))
    saver = self._saver(workdir)
    saver.config = self.config if self._given is None else objects.Objects(**self._given).named(self.config)
    saver.stream = self._stream
    saver.save(step, state, self.backend, metrics)
    if wait:  # Closed: nothing of it is left running when the caller's process ends.
      self._savers.pop(workdir).close()
    return step

  def restore(self, workdir: str, state: step_lib.TrainState, step: int | None = None) -> tuple[Any, int]:
    """(checkpoint `step` of WORKDIR, default the newest, laid out as `state`; its step), or (`state`, 0) if none."""
    return self._restore(workdir, lambda: state, step, state)

  def _restore(self, workdir: str, init: Callable[[], Any], step: int | None, given: Any = None) -> tuple[Any, int]:
    saver = self._saver(workdir)
    step = saver.latest_step() if step is None else step
    try:
      if step is not None:
        self._restored = f"{saver.directory}/{step}", saver.stored_meta(step).get("stream", {})
      self.restored_from = step
      if step is None and given is not None:  # Placed: a jit cannot close over a state sharded across processes.
        return given, 0
      return saver.restore_or_init(self.backend, init, step, self.strategy), step or 0
    except BaseException:
      self._savers.pop(workdir).close()  # Nothing of a failed restore is left open.
      raise

  def _saver(self, workdir: str) -> checkpoint.Checkpointer:
    """The open checkpointer of `workdir` (one orbax manager for its restores and saves)."""
    if workdir not in self._savers:
      self._savers[workdir] = checkpoint.Checkpointer(workdir, self.config)
    return self._savers[workdir]

  def wait(self) -> None:
    """Blocks until every save started with `wait=False` is written."""
    for saver in self._savers.values():
      saver.wait()

  def close(self) -> None:
    """Waits for pending saves and releases the checkpoint managers (also on leaving `with DataParallel(...)`)."""
    savers, self._savers = self._savers, {}
    for saver in savers.values():
      saver.close()

  def __enter__(self) -> "DataParallel":
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()

  def step(self, fn: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]]) -> Callable:
    """`fn(state, batch) -> (state, metrics)` on every device, compiled, `state` donated and entering as each device's
    own copy, as in DDP: `lax.pmean` a bare `jax.grad`; outputs must agree on every device (docs/your-own-loop.md)."""
    if (sharded := self.strategy).shards_state:
      raise ConfigError(f"@dp.step takes a replicated state; {sharded.flag} ({sharded.title}) serves dp.train_step")
    if not isinstance(self.backend, parallel.MeshBackend):
      raise ConfigError("@dp.step runs on the mesh backend (parallel.backend 'mesh')")
    return wrap.user_step(fn, self.backend)

  example_keys = staticmethod(wrap.example_keys)  # Randomness in `@dp.step`: docs/your-own-loop.md#randomness.

  def value_and_grad(self, loss_fn: Callable[..., Any]) -> Callable[..., tuple[jax.Array, PyTree]]:
    """Inside `@dp.step`: `loss_fn(params, batch, *args)` -> per-example losses [B] (or a weighted `tasks.Metric`) as
    `(params, batch, *args) -> (loss, grads)` of the GLOBAL batch's Σw·ℓ/Σw, the same on every device."""
    return wrap.value_and_grad(loss_fn, self.strategy, strategies.DataAxis(parallel.AXIS, mark_varying=False))

  def _open(self, data: Any, split: str | None, train: bool) -> tuple[datalib.Dataset, str]:
    """The dataset of a name or of data objects (opened once per object) and the split to read."""
    split = split or (self.config.dataset.train_split if train else self.config.dataset.eval_split)
    if isinstance(data, datalib.Dataset):
      return data, split
    key = (data if isinstance(data, str) else id(data), train)
    if key not in self._datasets:
      config = ml_collections.ConfigDict(self.config.dataset.to_dict())
      if isinstance(data, str):
        config.name = data
        if self._given is not None:  # Its checkpoints' config names the dataset.
          self.config.dataset.name = data
        ds = datalib.load(config)
      else:
        ds = datalib.load(config, **{"train_data" if train else "eval_data": data})
        self._name(**{"train_data" if train else "eval_data": data})
      self._datasets[key] = (data, ds)  # The object kept with it, so that its id is never another's.
    return self._datasets[key][1], split

  def _name(self, **given: Any) -> None:
    """Notes objects a checkpoint's config names (`objects.Objects.named`); not for a config's own dp."""
    if self._given is not None:
      self._given.update(given)

  def _check_sharded(self, tx: optax.GradientTransformation, params: PyTree) -> None:
    """A ConfigError naming the optimizer when ZeRO-1 shards the state of one that is not elementwise."""
    why = self.strategy.shards_state and zero1_check.refusal(tx, params, self.strategy.options.num_shards)
    if why:
      name = objects.shown(self.config.optimizer if self._given is None else tx)
      raise ConfigError(f"optimizer {name} cannot run under parallel.{self.strategy.flag} "
                        f"({self.strategy.title}), which updates each device's slice of a parameter alone: {why}")

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
