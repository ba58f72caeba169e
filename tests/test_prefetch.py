"""parallel.prefetch: one thread reads and places batches ahead, in order; its errors reach the loop; it stops."""

import gc
import threading
import time
from collections.abc import Iterator

import jax
import numpy as np
import pytest
import runs

from jaxdp import parallel

Batch = dict[str, np.ndarray]


class Placing:
  """A backend stand-in: `put_batch` tags each batch and remembers which thread placed it."""

  def __init__(self, delay_s: float = 0.0):
    self.delay_s, self.threads = delay_s, []

  def put_batch(self, batch: Batch) -> Batch:
    time.sleep(self.delay_s)
    self.threads.append(threading.current_thread())
    return {**batch, "placed": True}


def _batches(n: int, delay_s: float = 0.0, fail_at: int | None = None, read: list | None = None) -> Iterator[Batch]:
  """Batches 0..n-1 (`x` holds the index), each after `delay_s`; `fail_at` raises OSError instead of that one."""
  for i in range(n):
    time.sleep(delay_s)
    if i == fail_at:
      raise OSError(f"disk gone at batch {i}")
    if read is not None:
      read.append(i)
    yield {"x": np.full([8], i)}


@pytest.fixture(autouse=True)
def _no_thread_left():
  yield
  gc.collect()
  deadline = time.monotonic() + 5
  while runs.prefetch_threads() and time.monotonic() < deadline:
    time.sleep(0.01)
  assert not runs.prefetch_threads(), "a prefetch thread outlived its iterator"


@pytest.mark.parametrize("size", [0, 1, 2, 5])
def test_every_batch_in_order_placed_once(size):
  backend = Placing()
  out = list(parallel.prefetch(backend, _batches(20), size))
  assert [int(b["x"][0]) for b in out] == list(range(20)) and all(b["placed"] for b in out)
  assert len(backend.threads) == 20


def test_batches_are_read_and_placed_in_one_thread_apart_from_the_loops():
  backend = Placing()
  assert len(list(parallel.prefetch(backend, _batches(5), 2))) == 5
  assert len(set(backend.threads)) == 1 and backend.threads[0] is not threading.current_thread()


def test_it_reads_ahead_while_the_loop_works_but_no_more_than_size():
  read: list[int] = []
  batches = parallel.prefetch(Placing(), _batches(100, read=read), 3)
  assert int(next(batches)["x"][0]) == 0
  time.sleep(0.3)  # The loop's "step": the thread fills the queue meanwhile, then waits.
  assert len(read) in (4, 5)  # The one taken, 3 queued, and at most one read waiting for room.
  batches.close()


def test_a_slow_producer_is_waited_for_in_order():
  backend = Placing(delay_s=0.02)
  out = list(parallel.prefetch(backend, _batches(10, delay_s=0.01), 2))
  assert [int(b["x"][0]) for b in out] == list(range(10))


def test_waited_counts_only_batches_not_placed_yet():
  """The loop books `waited` as input: a batch placed ahead is none, however long the loop's thread then waits
  to run; a slow stream's batches are, as is every batch placed when asked (size 0)."""
  ready = parallel.prefetch(Placing(), _batches(4), 8)
  deadline = time.monotonic() + 30
  while ready._queue.qsize() < 5 and time.monotonic() < deadline:  # The thread places all four, then their end.
    time.sleep(0.01)
  assert len(list(ready)) == 4 and ready.waited == 0.0
  slow = parallel.prefetch(Placing(), _batches(4, delay_s=0.1), 2)
  assert len(list(slow)) == 4 and slow.waited >= 0.3
  inline = parallel.prefetch(Placing(), _batches(3, delay_s=0.05), 0)
  assert len(list(inline)) == 3 and inline.waited >= 0.15


@pytest.mark.parametrize("size", [0, 1, 3])
def test_an_error_in_the_stream_is_raised_by_the_next_of_its_batch(size):
  batches = parallel.prefetch(Placing(), _batches(10, fail_at=4), size)
  assert [int(next(batches)["x"][0]) for _ in range(4)] == [0, 1, 2, 3]  # Those before it, all of them.
  with pytest.raises(OSError, match="disk gone at batch 4"):
    next(batches)
  with pytest.raises(StopIteration):  # Then the stream is over.
    next(batches)


def test_an_error_in_the_placement_is_raised_in_the_loops_thread():
  class Failing(Placing):
    def put_batch(self, batch: Batch) -> Batch:
      if int(batch["x"][0]) == 2:
        raise KeyboardInterrupt  # Anything at all: not lost in the thread.
      return super().put_batch(batch)

  batches = parallel.prefetch(Failing(), _batches(10), 2)
  next(batches), next(batches)
  with pytest.raises(KeyboardInterrupt):
    next(batches)


def test_close_stops_a_thread_waiting_for_room_at_once():
  """Not one more read once closed, and no batch left placed: a device batch the queue kept would hold its memory."""
  read: list[int] = []
  batches = parallel.prefetch(Placing(), _batches(10**6, read=read), 2)
  next(batches)
  deadline = time.monotonic() + 30
  while len(read) < 4 and time.monotonic() < deadline:  # The one taken, two queued, and one waiting for room.
    time.sleep(0.01)
  time.sleep(0.05)
  began = time.monotonic()
  batches.close()
  assert time.monotonic() - began < 1.0 and not runs.prefetch_threads()
  assert read == [0, 1, 2, 3] and batches._queue.empty()
  time.sleep(0.1)
  assert len(read) == 4  # Nothing read after close.
  with pytest.raises(StopIteration):
    next(batches)


def test_close_waits_for_a_slow_read_to_end_then_stops():
  batches = parallel.prefetch(Placing(), _batches(10**6, delay_s=0.3), 2)
  next(batches)  # The thread is now inside the next slow read.
  batches.close()
  assert not runs.prefetch_threads()


def test_dropping_the_iterator_stops_its_thread():
  batches = parallel.prefetch(Placing(), _batches(10**6), 2)
  next(batches)
  del batches
  gc.collect()
  deadline = time.monotonic() + 2
  while runs.prefetch_threads() and time.monotonic() < deadline:
    time.sleep(0.01)
  assert not runs.prefetch_threads()


def test_device_batches_of_a_real_backend_in_order():
  backend = parallel.make_backend("mesh", 8)
  out = list(parallel.prefetch(backend, _batches(6), 2))
  assert [np.asarray(b["x"]).tolist() for b in out] == [[i] * 8 for i in range(6)]
  assert all(len(b["x"].addressable_shards) == 8 for b in out)


@pytest.mark.parametrize("name", ["mesh", "pmap"])
@pytest.mark.parametrize("devices", [1, 8])
def test_put_batch_places_the_same_arrays_as_one_call_per_array(name, devices):
  backend = parallel.make_backend(name, devices)
  host = {"x": np.arange(16 * 3, dtype=np.float32).reshape(16, 3), "y": np.arange(16, dtype=np.int32)}
  placed = backend.put_batch(host)
  assert sorted(placed) == ["x", "y"]
  for k, v in host.items():
    if name == "mesh":
      one = jax.make_array_from_process_local_data(backend.sharded, v)
    else:
      local = jax.sharding.NamedSharding(backend._local_mesh, jax.sharding.PartitionSpec("data"))
      one = jax.device_put(v.reshape(devices, 16 // devices, *v.shape[1:]), local)
    assert placed[k].sharding == one.sharding and placed[k].dtype == one.dtype
    np.testing.assert_array_equal(np.asarray(placed[k]), np.asarray(one))
