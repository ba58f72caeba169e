"""The one way train batches reach the devices: blocks of k >= 1 steps, each placed in one transfer ahead by one
thread, the step taking its batch out of the block on the devices (docs/design-notes.md#one-feeder)."""

import atexit
import dataclasses
import itertools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jaxdp import data, parallel
from jaxdp.batch import INDEX
from jaxdp.data import preprocess
from jaxdp.data.source import INPUTS

log = logging.getLogger("jaxdp")
PyTree = Any
Block = dict[str, np.ndarray]  # Each feature stacked [steps, rows, ...].
WARM_BLOCKS, TIMED_BLOCKS = 4, 20  # The rate is logged over blocks 5..24: after tf.data's threads and XLA's compile.
BLOCK_MIB = 4.0  # Bytes of batches per transfer; beyond it the transfer's cost per step is already small.
MAX_STEPS = 64   # Beyond this a block only reads further ahead.


def steps_per_block(ds: data.Dataset, rows: int) -> int:
  """Steps per transfer for `rows` rows a step of `ds`: 1 where tf.data decodes, else as many as fit BLOCK_MIB."""
  if data.decoded_by(ds):
    return 1
  return int(max(1, min(MAX_STEPS, BLOCK_MIB * 2**20 // max(1, rows * ds.row_bytes()))))


def uint8_to_devices(ds: data.Dataset) -> tuple[data.Dataset, Callable[[PyTree], PyTree]]:
  """`ds` read with its uint8 inputs kept uint8, and the `finish` that scales them once placed: a quarter of
  float32's bytes per transfer and no float arithmetic on the host (docs/design-notes.md#uint8-to-the-devices)."""
  pre = dataclasses.replace(ds.options.preprocess, uint8_out=True)
  return dataclasses.replace(ds, options=dataclasses.replace(ds.options, preprocess=pre)), preprocess.scale_on_device(pre)


def stack(batches: Iterator[data.Batch], steps: int) -> Iterator[tuple[Block, int]]:
  """The host batches as blocks of `steps`, each with how many of its steps are real; a failed read's error is raised
  after the block it cut short, so that it surfaces at the step whose batch failed."""
  while True:
    chunk, error = [], None
    try:
      chunk.extend(itertools.islice(batches, steps))
    except Exception as e:
      if not chunk:
        raise
      error = e
    if not chunk:
      return
    real = len(chunk)
    if steps == 1:  # A view: a decoded image batch is never copied on the host.
      yield {k: v[None] for k, v in chunk[0].items()}, real
    else:
      chunk += [chunk[-1]] * (steps - real)  # Same shape as every block: the step compiles once.
      yield {k: np.stack([b[k] for b in chunk]) for k in chunk[0]}, real
    if error is not None:
      raise error


def describe(ds: data.Dataset, rows: int, steps: int, prefetch: int) -> str:
  """The start summary's `input` line: how host batches of `rows` rows reach the devices, and why."""
  ahead = f"{prefetch} transfers ahead by a thread"
  if steps > 1:
    return (f"{steps} steps' batches per transfer (nothing to decode), {ahead}; the step takes its batch from the "
            f"block; its rate is logged once warm")
  why = data.decoded_by(ds) or f"one step's batch, {rows * ds.row_bytes() / 2**20:.3g} MiB, fills a transfer"
  return f"one transfer per step ({why}), {ahead}; its rate is logged once warm"


class Feeder(Iterator[tuple[PyTree, jax.Array]]):
  """`(device block, index)` for each step of `batches`, one thread placing blocks `depth` ahead; `waited`: the
  seconds `next` waited for it; its errors are raised by the `next` of their step; stopped by `close` or at the end."""
  JOIN_S = 30.0  # How long `close` waits for the thread to finish the block it is reading.
  _EMPTY = queue.Empty  # Held by the class: at interpreter exit the module's globals may already be gone.

  def __init__(self, backend: parallel.Backend, batches: Iterator[data.Batch], steps: int, depth: int, *,
               on_ids: Callable[[np.ndarray], None] | None = None, abstract: PyTree = None, about: str = "",
               finish: Callable[[PyTree], PyTree] | None = None):
    self.steps, self.abstract, self.about = steps, abstract, about  # The shapes of an item; how it is fed.
    self._source = batches
    self._indices = [backend.put_index(i) for i in range(steps)]  # Placed once; every block reuses them.
    self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
    self._stop = threading.Event()
    blocks = stack(_take_ids(iter(batches), on_ids) if on_ids else iter(batches), steps)
    put = backend.put_block if finish is None else _finished(backend.put_block, finish)
    self.rate = Rate()
    self._thread = threading.Thread(target=_produce, args=(put, blocks, self._queue, self._stop, self.rate),
                                    name="jaxdp-prefetch", daemon=True)  # Daemon: a stuck read never holds exit.
    self._block, self._real, self._at, self._done = None, 0, 0, False
    self.waited = 0.0
    self._thread.start()
    _open.add(self)

  def skipped_through(self, step: int) -> int:
    """Bad examples the host stream replaced in this process's rows of steps up to `step` (skip_bad_examples)."""
    return data.skipped_through(self._source, step)

  def __next__(self) -> tuple[PyTree, jax.Array]:
    if self._at == self._real:
      (self._block, self._real), self._at = self._next_block(), 0
    self._at += 1
    return self._block, self._indices[self._at - 1]

  def _next_block(self) -> tuple[PyTree, int]:
    """The next placed block and its real steps; raises the thread's error, or StopIteration at the end."""
    if self._done:
      raise StopIteration
    try:  # A block placed ahead is no wait for input, however long the loop's thread waits to run meanwhile.
      item, error = self._queue.get_nowait()
    except queue.Empty:
      began = time.perf_counter()
      item, error = self._queue.get()
      self.waited += time.perf_counter() - began
    if item is not _END and error is None:
      return item
    self._done = True
    self._thread.join()  # Finished: the thread's frames, which the error's traceback holds, can be released.
    if error is not None:
      raise error
    raise StopIteration

  def close(self) -> None:
    """Stops the thread and drops the blocks it placed ahead; returns once it stopped (at most JOIN_S)."""
    self._done = True
    self._stop.set()
    self._drain()  # A thread waiting to put a block sees the room, then the stop.
    if self._thread.is_alive() and self._thread is not threading.current_thread():
      self._thread.join(self.JOIN_S)
      if self._thread.is_alive():
        log.warning("the input prefetch thread is still reading a batch after %.0f s; leaving it", self.JOIN_S)
    self._drain()  # The block it put on its way out.

  def _drain(self) -> None:
    """Drops whatever the queue holds, without waiting."""
    while True:
      try:
        self._queue.get_nowait()
      except self._EMPTY:
        return

  def __del__(self) -> None:
    # Not when __init__ failed before the thread existed, nor once closed: at interpreter exit a global feeder is
    # collected after the modules `close` reads.
    if hasattr(self, "_thread") and not self._stop.is_set():
      self.close()


_open: "weakref.WeakSet[Feeder]" = weakref.WeakSet()  # Feeders whose thread may still run.


@atexit.register
def _close_open() -> None:
  """Stops every feeder still open at exit (a script's, never closed), before Python ends its daemon threads: one
  ended inside XLA's C++ (placing a block) aborts the process ("FATAL: exception not rethrown")."""
  for feeder in list(_open):
    feeder.close()


def _take_ids(batches: Iterator[data.Batch], on_ids: Callable[[np.ndarray], None]) -> Iterator[data.Batch]:
  """`batches` without their example ids (`batch.INDEX`), each given to `on_ids` as it is read."""
  for batch in batches:
    batch = dict(batch)
    on_ids(np.asarray(batch.pop(INDEX), np.int64))
    yield batch


def _finished(put: Callable[[Block], PyTree], finish: Callable[[PyTree], PyTree]) -> Callable[[Block], PyTree]:
  """`put`, then `finish` on the devices for blocks whose inputs are uint8 (`uint8_to_devices`)."""
  def put_finished(block: Block) -> PyTree:
    placed = put(block)
    return finish(placed) if getattr(block.get(INPUTS), "dtype", None) == np.uint8 else placed

  return put_finished


_END = object()  # The stream's end, as the thread queues it.
_PUT_POLL_S = 0.1  # How often a thread waiting for room checks for `close`.


class Rate:
  """Examples per second the feeding thread reads and places, its waits for room in the queue left out: the input
  pipeline's rate where input limits the step (else at least the step's rate); logged once, after warm-up."""

  def __init__(self):
    self.blocks, self.examples, self.seconds = 0, 0, 0.0

  def add(self, examples: int, seconds: float) -> None:
    """Counts one block of `examples` read and placed in `seconds`; logs the rate after the timed blocks."""
    self.blocks += 1
    if WARM_BLOCKS < self.blocks <= WARM_BLOCKS + TIMED_BLOCKS:
      self.examples, self.seconds = self.examples + examples, self.seconds + seconds
      if self.blocks == WARM_BLOCKS + TIMED_BLOCKS:
        self.log()

  def log(self) -> None:
    """Logs the rate over the timed blocks so far (also at a stream's end before the last of them: 64-step blocks)."""
    if self.per_second is not None:
      log.info("input | %s examples/s once warm (read and placed by the feeding thread, blocks %d-%d)",
               f"{self.per_second:,.0f}", WARM_BLOCKS + 1, min(self.blocks, WARM_BLOCKS + TIMED_BLOCKS))

  @property
  def per_second(self) -> float | None:
    """The rate over the timed blocks so far (None before the first)."""
    return self.examples / self.seconds if self.seconds > 0 else None


def _produce(put: Callable[[Block], PyTree], blocks: Iterator[tuple[Block, int]], out: queue.Queue,
             stop: threading.Event, rate: Rate) -> None:
  """The prefetch thread: ((device block, real steps), None) per block, then (_END, None), or (None, error)."""
  try:
    began = time.perf_counter()
    for block, real in blocks:
      placed = put(block)
      rows = len(next(iter(block.values()), ())[0]) if block else 0
      rate.add(real * rows, time.perf_counter() - began)
      if not _put(out, ((placed, real), None), stop) or stop.is_set():
        return  # Stopped: not one more read.
      began = time.perf_counter()
    if rate.blocks < WARM_BLOCKS + TIMED_BLOCKS:  # Not logged yet.
      rate.log()
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
