"""The pmap and mesh backends: the run's devices, the state's layout, device batches, the mapped per-replica step."""

import abc
import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxdp.config import ConfigError
from jaxdp.strategies import DataAxis, DataParallel, Strategy

PyTree = Any
AXIS = "data"


class Backend(abc.ABC):
  """Maps a per-replica step `(state, batch, *, axis) -> out` over a 1-D set of devices."""
  axis: DataAxis

  def __init__(self, devices: list[jax.Device]):
    self.devices = devices
    self.local_devices = [d for d in devices if d.process_index == jax.process_index()]
    self.mesh = Mesh(np.array(devices), (AXIS,))

  @property
  def num_devices(self) -> int:
    return len(self.devices)

  @property
  def platform(self) -> str:
    """The platform of the run's devices ('cpu', 'gpu', 'tpu')."""
    return self.devices[0].platform

  @abc.abstractmethod
  def init(self, fn: Callable[[], PyTree]) -> PyTree:
    """Runs `fn` (a deterministic state constructor) so that every device holds the result."""

  @abc.abstractmethod
  def put_batch(self, batch: dict[str, np.ndarray]) -> PyTree:
    """This process's host batch -> a device batch, rows split over the devices (what eval steps take)."""

  @abc.abstractmethod
  def put_block(self, block: dict[str, np.ndarray]) -> PyTree:
    """This process's batches of k steps, stacked [k, rows, ...] -> a device block, rows split over the devices."""

  @abc.abstractmethod
  def put_index(self, index: int) -> jax.Array:
    """A step's index in its block, on every device (what `map_train`'s step takes with the block)."""

  @abc.abstractmethod
  def abstract_item(self, spec: dict[str, jax.ShapeDtypeStruct], rows: int, steps: int) -> PyTree:
    """A train step's input shapes, for blocks of `steps` steps of `rows` rows a process, each row as `spec`."""

  def put_step(self, batch: dict[str, np.ndarray]) -> tuple[PyTree, jax.Array]:
    """One host batch as a train step takes it: a block of one step, and index 0."""
    return self.put_block({k: v[None] for k, v in batch.items()}), self.put_index(0)

  @abc.abstractmethod
  def map_train(self, step: Callable[..., Any]) -> Callable[..., Any]:
    """The compiled, device-mapped `step(state, batch)` as `(state, (block, index))` (`select`); the state donated."""

  @abc.abstractmethod
  def map_eval(self, step: Callable[..., Any]) -> Callable[..., Any]:
    """The compiled, device-mapped `step(state, batch) -> metrics`."""

  @abc.abstractmethod
  def map_per_device(self, fn: Callable[[PyTree], jax.Array]) -> Callable[[PyTree], jax.Array]:
    """Compiled once: `fn` on each device's own copy of a replicated tree, one result per device."""

  def get(self, tree: PyTree) -> PyTree:
    """One host copy (numpy) of a replicated tree, e.g. metrics or parameters (read from one device only)."""
    return jax.tree.map(lambda x: self._host(x.addressable_data(0)), tree)

  def replicated(self, tree: PyTree) -> list[jax.Array]:
    """The leaves of a state tree that every device holds whole (what replicas compare): all of them here."""
    return jax.tree.leaves(tree)

  def replicas(self, tree: PyTree) -> PyTree:
    """Every local replica of a replicated tree, stacked on a leading axis (numpy)."""
    return jax.tree.map(lambda x: np.stack([self._host(s.data) for s in x.addressable_shards]), tree)

  def _host(self, shard: jax.Array) -> np.ndarray:
    """One device's copy of a replicated leaf, on the host."""
    return np.asarray(shard)

  def bind_state(self, abstract_state: PyTree, specs: PyTree = None) -> None:
    """Lays the state's leaves out by the strategy's PartitionSpecs `specs` (default: replicated), before `init`."""
    self.state_specs = specs if specs is not None else jax.tree.map(lambda _: P(), abstract_state)

  def abstract_global(self, abstract: PyTree) -> PyTree:
    """Shapes of a state (from `jax.eval_shape`) as global arrays laid out over all devices (for orbax)."""
    specs = getattr(self, "state_specs", None) or jax.tree.map(lambda _: P(), abstract)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(self.mesh, s)),
                        abstract, specs)

  def to_global(self, tree: PyTree) -> PyTree:
    """This backend's replicated layout -> global arrays replicated over all devices (for orbax)."""
    return tree

  def from_global(self, tree: PyTree) -> PyTree:
    """Global replicated arrays -> this backend's replicated layout."""
    return tree


class PmapBackend(Backend):
  """`jax.pmap` over this process's devices; leaves carry a leading [local_devices] axis."""
  axis = DataAxis(AXIS, mark_varying=False)

  def __init__(self, devices: list[jax.Device]):
    super().__init__(devices)
    self._local_mesh = Mesh(np.array(self.local_devices), (AXIS,))
    self._stacked = NamedSharding(self._local_mesh, P(AXIS))  # Leaves [local_devices, ...], one row per device.
    self._pmap = functools.partial(jax.pmap, axis_name=AXIS, devices=self.devices)

  def init(self, fn: Callable[[], PyTree]) -> PyTree:
    # Each device builds the same state itself: no host copy, no transfer.
    return self._pmap(lambda _: fn())(np.zeros(len(self.local_devices)))

  def put_batch(self, batch: dict[str, np.ndarray]) -> PyTree:
    n = len(self.local_devices)
    # One call for the whole batch: cheaper than one per array (docs/design-notes.md#loop-host-costs).
    return jax.device_put({k: v.reshape(n, v.shape[0] // n, *v.shape[1:]) for k, v in batch.items()}, self._stacked)

  def put_block(self, block: dict[str, np.ndarray]) -> PyTree:
    n = len(self.local_devices)

    def per_device(v: np.ndarray) -> np.ndarray:  # [steps, rows, ...] -> [devices, steps, rows / devices, ...]
      return np.ascontiguousarray(np.swapaxes(v.reshape(v.shape[0], n, v.shape[1] // n, *v.shape[2:]), 0, 1))

    return jax.device_put({k: per_device(v) for k, v in block.items()}, self._stacked)

  def put_index(self, index: int) -> jax.Array:
    return jax.device_put(np.full(len(self.local_devices), index, np.int32), self._stacked)

  def abstract_item(self, spec: dict[str, jax.ShapeDtypeStruct], rows: int, steps: int) -> PyTree:
    n = len(self.local_devices)
    block = {k: jax.ShapeDtypeStruct((n, steps, rows // n, *v.shape), v.dtype) for k, v in spec.items()}
    return block, jax.ShapeDtypeStruct((n,), np.int32)

  def map_train(self, step: Callable[..., Any]) -> Callable[..., Any]:
    # A block's leaves and the index carry the device axis first, as a batch's do: pmap maps them alike.
    return self._pmap(select(functools.partial(step, axis=self.axis)), donate_argnums=0)

  def map_eval(self, step: Callable[..., Any]) -> Callable[..., Any]:
    return self._pmap(functools.partial(step, axis=self.axis))

  def _host(self, shard: jax.Array) -> np.ndarray:
    return np.asarray(shard)[0]  # A pmap shard keeps its leading [1] device axis.

  def map_per_device(self, fn: Callable[[PyTree], jax.Array]) -> Callable[[PyTree], jax.Array]:
    return self._pmap(fn)

  def to_global(self, tree: PyTree) -> PyTree:
    # pmap's [local_devices, ...] replicas become one global array per leaf, without a host copy.
    replicated = NamedSharding(self.mesh, P())

    def one(x: jax.Array) -> jax.Array:
      by_device = {s.device: s.data.reshape(x.shape[1:]) for s in x.addressable_shards}
      shards = [by_device[d] for d in self.local_devices]
      return jax.make_array_from_single_device_arrays(x.shape[1:], replicated, shards)

    return jax.tree.map(one, tree)

  def from_global(self, tree: PyTree) -> PyTree:
    n = len(self.local_devices)

    def one(x: jax.Array) -> jax.Array:
      by_device = {s.device: s.data for s in x.addressable_shards}
      shards = [by_device[d].reshape(1, *x.shape) for d in self.local_devices]
      return jax.make_array_from_single_device_arrays((n, *x.shape), self._stacked, shards)

    return jax.tree.map(one, tree)


class MeshBackend(Backend):
  """`jax.jit` of `jax.shard_map` over Mesh('data'): state replicated P() (or as `bind_state` says), batch P('data')."""

  def __init__(self, devices: list[jax.Device], checked: bool = True, compiler_options: dict[str, Any] | None = None):
    super().__init__(devices)
    self.compiler_options = compiler_options  # The strategy's, for every step compiled (`Strategy.compiler_options`).
    # Unchecked (no implicit psum in `grad`) where the strategy gathers across devices itself, and on one device,
    # where the strategy can skip the all-reduce (a replica's values are the means).
    self.checked = checked and len(devices) > 1
    self.axis = DataAxis(AXIS, mark_varying=self.checked)
    self.sharded = NamedSharding(self.mesh, P(AXIS))
    self.state_specs: PyTree = P()  # A prefix: the whole state replicated, until bind_state.

  def init(self, fn: Callable[[], PyTree]) -> PyTree:
    # Created already in place on every device (replicated, or sharded for ZeRO), never first on one.
    return jax.jit(fn, out_shardings=jax.tree.map(lambda s: NamedSharding(self.mesh, s), self.state_specs))()

  def put_batch(self, batch: dict[str, np.ndarray]) -> PyTree:
    # One process: one device_put of the whole dict, cheaper than one per array (docs/design-notes.md#loop-host-costs).
    return jax.make_array_from_process_local_data(self.sharded, batch)

  def put_block(self, block: dict[str, np.ndarray]) -> PyTree:
    # Rows sharded as a batch's, along the block's second axis.
    return jax.make_array_from_process_local_data(NamedSharding(self.mesh, P(None, AXIS)), block)

  def put_index(self, index: int) -> jax.Array:
    return jax.make_array_from_process_local_data(NamedSharding(self.mesh, P()), np.int32(index))

  def abstract_item(self, spec: dict[str, jax.ShapeDtypeStruct], rows: int, steps: int) -> PyTree:
    sharding, rows = NamedSharding(self.mesh, P(None, AXIS)), rows * jax.process_count()
    block = {k: jax.ShapeDtypeStruct((steps, rows, *v.shape), v.dtype, sharding=sharding) for k, v in spec.items()}
    return block, jax.ShapeDtypeStruct((), np.int32, sharding=NamedSharding(self.mesh, P()))

  def _shard_map(self, step: Callable[..., Any], out_specs: Any, batch_specs: Any = P(AXIS)) -> Callable[..., Any]:
    return jax.shard_map(functools.partial(step, axis=self.axis), mesh=self.mesh,
                         in_specs=(self.state_specs, batch_specs), out_specs=out_specs, check_vma=self.checked)

  def map_train(self, step: Callable[..., Any]) -> Callable[..., Any]:
    mapped = self._shard_map(select(step), (self.state_specs, P()), (P(None, AXIS), P()))
    return jax.jit(mapped, donate_argnums=0, compiler_options=self.compiler_options)

  def map_eval(self, step: Callable[..., Any]) -> Callable[..., Any]:
    return jax.jit(self._shard_map(step, P()), compiler_options=self.compiler_options)

  def get(self, tree: PyTree) -> PyTree:
    """One whole host copy (numpy) of a tree: a replicated leaf read from one device, a sharded one gathered."""
    return jax.tree.map(lambda x: self._host(x.addressable_data(0)) if x.is_fully_replicated else _whole(x), tree)

  def replicated(self, tree: PyTree) -> list[jax.Array]:
    return [x for x in jax.tree.leaves(tree) if x.is_fully_replicated]  # A sharded leaf has no replicas.

  def map_per_device(self, fn: Callable[[PyTree], jax.Array]) -> Callable[[PyTree], jax.Array]:
    # Unchecked: each device must see its own buffer, not what replication says it should hold.
    return jax.jit(jax.shard_map(lambda t: fn(t)[None], mesh=self.mesh, in_specs=P(), out_specs=P(AXIS),
                                 check_vma=False))


def _whole(x: jax.Array) -> np.ndarray:
  """A sharded global array on the host, whole (gathered from every process)."""
  return np.asarray(multihost_utils.process_allgather(x, tiled=True) if jax.process_count() > 1 else x)


BACKENDS: dict[str, type[Backend]] = {"pmap": PmapBackend, "mesh": MeshBackend}


def make_backend(name: str, num_devices: int = 0, strategy: type[Strategy] = DataParallel,
                 devices: list[jax.Device] | None = None) -> Backend:
  """Backend `name` for the class `strategy`, over `devices` (default: all), or their first `num_devices`."""
  if name not in BACKENDS:
    raise ConfigError(f"unknown parallel.backend {name!r} (choose from {', '.join(BACKENDS)})")
  devices = list(devices) if devices else jax.devices()
  if num_devices:
    if jax.process_count() > 1:
      raise ConfigError(f"parallel.num_devices ({num_devices}) is for single-process runs; use 0 (all devices)")
    if num_devices > len(devices):
      raise ConfigError(f"parallel.num_devices ({num_devices}) exceeds the {len(devices)} available devices")
    devices = devices[:num_devices]
  if name == "mesh":  # A sharded state is gathered by the step.
    return MeshBackend(devices, strategy.checked and not strategy.shards_state,
                       strategy.compiler_options(devices[0].platform))
  if strategy.shards_state:
    raise ConfigError(f"parallel.{strategy.flag} ({strategy.title}) needs parallel.backend 'mesh', got {name!r}")
  return PmapBackend(devices)


def select(step: Callable[..., Any]) -> Callable[..., Any]:
  """The per-replica `step(state, batch, **kw)` as `(state, (block, index), **kw)`: on the block's batch `index`."""

  def block_step(state: Any, item: tuple[PyTree, jax.Array], **kwargs: Any) -> Any:
    block, index = item
    return step(state, jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, index, 0, keepdims=False), block), **kwargs)

  # The program keeps the step's name (jit_train_step): XLA dumps and profiles are found by it.
  block_step.__name__ = block_step.__qualname__ = getattr(getattr(step, "func", step), "__name__", "step")
  return block_step
