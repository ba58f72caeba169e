"""The device backends: which devices a run uses, how state is laid out on them, how a host batch becomes
a device batch, and how the per-replica step is mapped over them, for the `pmap` and `mesh` backends.

Devices are chosen and laid out here; elsewhere they are only read: the step and the strategies see the
`DataAxis` a backend gives them,
the loop asks a `Backend` for replicas and copies (and the platform, e.g. to bound steps in flight), and
`report/` names the device kind.
"""

import abc
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxdp.config import ConfigError
from jaxdp.strategies import DataAxis, DataParallel, Strategy

log = logging.getLogger("jaxdp")
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
    """This process's host batch -> the step's device batch (the one host-to-device seam)."""

  @abc.abstractmethod
  def put_block(self, block: tuple[dict[str, np.ndarray], np.ndarray]) -> PyTree:
    """This process's (batches stacked [steps, rows, ...], first step) -> a device block (`jaxdp.blocks`)."""

  @abc.abstractmethod
  def put_replicated(self, tree: dict[str, np.ndarray]) -> PyTree:
    """Host arrays (the same in every process) -> a copy on every device, laid out as the state is."""

  @abc.abstractmethod
  def map_train(self, step: Callable[..., Any], block: bool = False, held: bool = False) -> Callable[..., Any]:
    """The compiled, device-mapped `step(state, batch) -> (state, metrics)`; the state is donated.

    `block`: the step takes a device block (`put_block`) in place of a batch (`jaxdp.blocks.select`);
    `held`: a pair (device block of row ids, `put_replicated` split) (`jaxdp.resident.select`).
    """

  @abc.abstractmethod
  def map_eval(self, step: Callable[..., Any]) -> Callable[..., Any]:
    """The compiled, device-mapped `step(state, batch) -> metrics`."""

  @abc.abstractmethod
  def replicas(self, tree: PyTree) -> PyTree:
    """Every local replica of a replicated tree, stacked on a leading axis (numpy)."""

  @abc.abstractmethod
  def map_per_device(self, fn: Callable[[PyTree], jax.Array]) -> Callable[[PyTree], jax.Array]:
    """Compiled once: `fn` on each device's own copy of a replicated tree, one result per device."""

  def get(self, tree: PyTree) -> PyTree:
    """One host copy (numpy) of a replicated tree, e.g. metrics or parameters (read from one device only)."""
    return jax.tree.map(lambda x: np.asarray(self._first_replica(x)), tree)

  def _first_replica(self, x: jax.Array) -> jax.Array:
    return x.addressable_data(0)

  def bind_state(self, abstract_state: PyTree, specs: PyTree = None) -> None:
    """Fixes how each leaf of the training state is laid out (before `init` and `map_train`).

    `specs`: PartitionSpecs over the data axis, as the gradient strategy lays the state out (default:
    everything replicated).
    """
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
    self._pmap = functools.partial(jax.pmap, axis_name=AXIS, devices=self.devices)

  def init(self, fn: Callable[[], PyTree]) -> PyTree:
    # Each device builds the same state itself: no host copy, no transfer.
    return self._pmap(lambda _: fn())(np.zeros(len(self.local_devices)))

  def put_batch(self, batch: dict[str, np.ndarray]) -> PyTree:
    sharding = NamedSharding(self._local_mesh, P(AXIS))
    n = len(self.local_devices)
    # One call for the whole batch: cheaper than one per array (docs/design-notes.md#loop-host-costs).
    return jax.device_put({k: v.reshape(n, v.shape[0] // n, *v.shape[1:]) for k, v in batch.items()}, sharding)

  def put_block(self, block: tuple[dict[str, np.ndarray], np.ndarray]) -> PyTree:
    batches, first = block
    sharding = NamedSharding(self._local_mesh, P(AXIS))
    n = len(self.local_devices)

    def per_device(v: np.ndarray) -> np.ndarray:  # [steps, rows, ...] -> [devices, steps, rows / devices, ...]
      return np.ascontiguousarray(np.swapaxes(v.reshape(v.shape[0], n, v.shape[1] // n, *v.shape[2:]), 0, 1))

    return jax.device_put(({k: per_device(v) for k, v in batches.items()}, np.full(n, first)), sharding)

  def put_replicated(self, tree: dict[str, np.ndarray]) -> PyTree:
    sharding = NamedSharding(self._local_mesh, P(AXIS))
    n = len(self.local_devices)

    def one(x: np.ndarray) -> jax.Array:  # One transfer per device, never n copies on the host.
      shards = [jax.device_put(x[None], d) for d in self.local_devices]
      return jax.make_array_from_single_device_arrays((n, *x.shape), sharding, shards)

    return {k: one(v) for k, v in tree.items()}

  def map_train(self, step: Callable[..., Any], block: bool = False, held: bool = False) -> Callable[..., Any]:
    # A block's (and a held split's) leaves carry the device axis first, as a batch's do: pmap maps them alike.
    return self._pmap(functools.partial(step, axis=self.axis), donate_argnums=0)

  def map_eval(self, step: Callable[..., Any]) -> Callable[..., Any]:
    return self._pmap(functools.partial(step, axis=self.axis))

  def _first_replica(self, x: jax.Array) -> jax.Array:
    return x.addressable_data(0)[0]  # A pmap shard keeps its leading [1] device axis.

  def replicas(self, tree: PyTree) -> PyTree:
    return jax.tree.map(lambda x: np.stack([np.asarray(s.data)[0] for s in x.addressable_shards]), tree)

  def map_per_device(self, fn: Callable[[PyTree], jax.Array]) -> Callable[[PyTree], jax.Array]:
    return self._pmap(fn)

  def to_global(self, tree: PyTree) -> PyTree:
    # pmap's [local_devices, ...] replicas become one global array per leaf, without a host copy.
    replicated = NamedSharding(self.mesh, P())

    def one(x: jax.Array) -> jax.Array:
      by_device = {s.device: s.data.reshape(x.shape[1:]) for s in x.addressable_shards}
      return jax.make_array_from_single_device_arrays(x.shape[1:], replicated, [by_device[d] for d in self.local_devices])

    return jax.tree.map(one, tree)

  def from_global(self, tree: PyTree) -> PyTree:
    stacked = NamedSharding(self._local_mesh, P(AXIS))
    n = len(self.local_devices)

    def one(x: jax.Array) -> jax.Array:
      by_device = {s.device: s.data for s in x.addressable_shards}
      shards = [by_device[d].reshape(1, *x.shape) for d in self.local_devices]
      return jax.make_array_from_single_device_arrays((n, *x.shape), stacked, shards)

    return jax.tree.map(one, tree)


class MeshBackend(Backend):
  """`jax.jit` of `jax.shard_map` over Mesh('data'): state replicated P(), batch sharded P('data').

  A gradient strategy may lay parts of the state out differently (ZeRO-1 shards the optimizer state
  P('data'): `bind_state`). Strategies that gather values across devices themselves (ZeRO-1's
  all-gather of new parameters, the invariant mode's ordered sum) leave replication to the step, so
  they run shard_map `unchecked` (`checked=False`): then `grad` adds no implicit psum and the
  parameters need no marking.
  """

  def __init__(self, devices: list[jax.Device], checked: bool = True):
    super().__init__(devices)
    # One device: unchecked, so the strategy can skip the all-reduce (a replica's values are the means).
    self.checked = checked and len(devices) > 1
    self.axis = DataAxis(AXIS, mark_varying=self.checked)
    self.sharded = NamedSharding(self.mesh, P(AXIS))
    self.state_specs: PyTree = P()  # A prefix: the whole state replicated, until bind_state.

  def _shardings(self, specs: PyTree) -> PyTree:
    return jax.tree.map(lambda s: NamedSharding(self.mesh, s), specs)

  def init(self, fn: Callable[[], PyTree]) -> PyTree:
    # Created already in place on every device (replicated, or sharded for ZeRO), never first on one.
    return jax.jit(fn, out_shardings=self._shardings(self.state_specs))()

  def put_batch(self, batch: dict[str, np.ndarray]) -> PyTree:
    # The whole batch in one call: with one process one device_put of the dict, cheaper than one per array
    # (docs/design-notes.md#loop-host-costs); with several, JAX places each array as before.
    return jax.make_array_from_process_local_data(self.sharded, batch)

  def put_block(self, block: tuple[dict[str, np.ndarray], np.ndarray]) -> PyTree:
    # Rows sharded as a batch's, along the block's second axis; the first step on every device.
    shardings = (NamedSharding(self.mesh, P(None, AXIS)), NamedSharding(self.mesh, P()))
    return jax.make_array_from_process_local_data(shardings, block)

  def put_replicated(self, tree: dict[str, np.ndarray]) -> PyTree:
    return jax.make_array_from_process_local_data(NamedSharding(self.mesh, P()), tree)

  def _shard_map(self, step: Callable[..., Any], out_specs: Any, batch_specs: Any = P(AXIS)) -> Callable[..., Any]:
    return jax.shard_map(functools.partial(step, axis=self.axis), mesh=self.mesh,
                         in_specs=(self.state_specs, batch_specs), out_specs=out_specs, check_vma=self.checked)

  def map_train(self, step: Callable[..., Any], block: bool = False, held: bool = False) -> Callable[..., Any]:
    batch_specs = (P(None, AXIS), P()) if block or held else P(AXIS)
    if held:  # The row ids' block, sharded as a block's rows; the split replicated.
      batch_specs = (batch_specs, P())
    return jax.jit(self._shard_map(step, (self.state_specs, P()), batch_specs), donate_argnums=0)

  def map_eval(self, step: Callable[..., Any]) -> Callable[..., Any]:
    return jax.jit(self._shard_map(step, P()))

  def replicas(self, tree: PyTree) -> PyTree:
    return jax.tree.map(lambda x: np.stack([np.asarray(s.data) for s in x.addressable_shards]), tree)

  def map_per_device(self, fn: Callable[[PyTree], jax.Array]) -> Callable[[PyTree], jax.Array]:
    # Unchecked: each device must see its own buffer, not what replication says it should hold.
    return jax.jit(jax.shard_map(lambda t: fn(t)[None], mesh=self.mesh, in_specs=P(), out_specs=P(AXIS),
                                 check_vma=False))


BACKENDS: dict[str, type[Backend]] = {"pmap": PmapBackend, "mesh": MeshBackend}


def make_backend(name: str, num_devices: int = 0, strategy: type[Strategy] = DataParallel,
                 devices: list[jax.Device] | None = None, checked: bool = True) -> Backend:
  """The backend `name` over all devices, or over the first `num_devices` (single process only), for `strategy`.

  `strategy`: the gradient strategy's class; one that shards the state (ZeRO-1: `shards_state`) needs the
  mesh backend, and one that gathers across devices itself (not `checked`) runs shard_map unchecked.
  `devices`: these instead of `jax.devices()` (e.g. a TPU topology's, for ahead-of-time compilation).
  `checked=False`: unchecked whatever the strategy (a hand-written step that reduces by itself).
  """
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
    return MeshBackend(devices, checked and strategy.checked and not strategy.shards_state)
  if strategy.shards_state:
    raise ConfigError(f"parallel.shard_optimizer_state (ZeRO-1) needs parallel.backend 'mesh', got {name!r}")
  return PmapBackend(devices)


def prefetch(backend: Backend, batches: Iterator[Any], size: int,
             put: Callable[[Any], PyTree] | None = None) -> "Prefetcher | Inline":
  """The device batches of `batches`, in order; `size` > 0: read and placed ahead by one thread, `size` deep.

  `size` 0: each batch is read and placed when asked for, in the caller's thread. `put`: how a host batch is
  placed (default `backend.put_batch`; `backend.put_block` for blocks of steps). Either way `waited` counts the
  seconds `next` spent on batches that were not placed yet: the input the caller waited for.
  """
  put = put or backend.put_batch
  if size <= 0:
    return Inline(batches, put)
  return Prefetcher(backend, batches, size, put)


class Inline(Iterator[PyTree]):
  """Each batch read and placed when `next` asks for it, in the caller's thread: all of that time waits for input."""

  def __init__(self, batches: Iterator[Any], put: Callable[[Any], PyTree]):
    self._batches, self._put = iter(batches), put
    self.waited = 0.0  # Seconds spent in `next`.

  def __next__(self) -> PyTree:
    began = time.perf_counter()
    try:
      return self._put(next(self._batches))
    finally:
      self.waited += time.perf_counter() - began

  def close(self) -> None:
    """Nothing runs ahead: nothing to stop."""


class Prefetcher(Iterator[PyTree]):
  """One background thread reads host batches and places them on devices, up to `size` ahead, in order.

  So reading and placing overlap the steps: `next` waits only when the thread is behind. An exception in the
  thread (the stream's, the placement's) is raised by the `next` that would have returned that batch. The
  thread stops at the stream's end, or at `close` (also on garbage collection): it holds no reference to
  this object, so dropping the iterator stops it.
  """
  JOIN_S = 30.0  # How long `close` waits for the thread to finish the batch it is reading.

  def __init__(self, backend: Backend, batches: Iterator[Any], size: int,
               put: Callable[[Any], PyTree] | None = None):
    self._queue: queue.Queue = queue.Queue(maxsize=size)
    self._stop = threading.Event()
    put = put or backend.put_batch
    self._thread = threading.Thread(target=_produce, args=(put, iter(batches), self._queue, self._stop),
                                    name="jaxdp-prefetch", daemon=True)  # Daemon: a stuck read never holds exit.
    self._done = False
    self.waited = 0.0  # Seconds `next` waited for a batch the thread had not placed yet (input, not host work).
    self._thread.start()

  def __next__(self) -> PyTree:
    if self._done:
      raise StopIteration
    try:  # A batch placed ahead is no wait for input, however long the loop's thread waits to run meanwhile.
      batch, error = self._queue.get_nowait()
    except queue.Empty:
      began = time.perf_counter()
      batch, error = self._queue.get()
      self.waited += time.perf_counter() - began
    if batch is not _END and error is None:
      return batch
    self._done = True
    self._thread.join()  # Finished: the thread's frames, which the error's traceback holds, can be released.
    if error is not None:
      raise error
    raise StopIteration

  def close(self) -> None:
    """Stops the thread and drops the batches it placed ahead; returns once it stopped (at most JOIN_S)."""
    self._done = True
    self._stop.set()
    self._drain()  # A thread waiting to put a batch sees the room, then the stop.
    if self._thread.is_alive() and self._thread is not threading.current_thread():
      self._thread.join(self.JOIN_S)
      if self._thread.is_alive():
        log.warning("the input prefetch thread is still reading a batch after %.0f s; leaving it", self.JOIN_S)
    self._drain()  # The batch it put on its way out.

  def _drain(self) -> None:
    """Drops whatever the queue holds, without waiting."""
    while True:
      try:
        self._queue.get_nowait()
      except queue.Empty:
        return

  def __del__(self) -> None:
    if hasattr(self, "_thread"):  # Not when __init__ failed before the thread existed.
      self.close()


_END = object()  # The stream's end, as the thread queues it.
_PUT_POLL_S = 0.1  # How often a thread waiting for room checks for `close`.


def _produce(put: Callable[[Any], PyTree], batches: Iterator[Any], out: queue.Queue, stop: threading.Event) -> None:
  """The prefetch thread: (device batch, None) per batch, then (_END, None), or (None, error) on a failure."""
  try:
    for batch in batches:
      if not _put(out, (put(batch), None), stop) or stop.is_set():
        return  # Stopped: not one more read.
    _put(out, (_END, None), stop)
  except BaseException as e:  # Anything, to be raised in the loop's thread.
    _put(out, (None, e), stop)


def _put(out: queue.Queue, item: tuple[Any, BaseException | None], stop: threading.Event) -> bool:
  """Queues `item` once there is room; False when stopped first."""
  while not stop.is_set():
    try:
      out.put(item, timeout=_PUT_POLL_S)
      return True
    except queue.Full:
      pass
  return False
