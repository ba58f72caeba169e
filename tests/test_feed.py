"""jaxdp.feed: blocks of k >= 1 steps placed ahead by one thread, in order; the step takes its batch from its block
on the devices; bitwise the same training as one transfer per step; errors reach the loop; the thread stops."""

import gc
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import jax
import numpy as np
import pytest
import runs

import jaxdp
from jaxdp import data, feed, parallel
from jaxdp.loop.train import train_and_evaluate

Batch = dict[str, np.ndarray]
ROW_BYTES = 8 * 8 * 4 + 4  # A digits row as batches hold it: float32 8x8x1 inputs, an int32 label.


class Placing:
  """A backend stand-in: `put_block` tags each block and remembers which thread placed it; indices stay ints."""

  def __init__(self, delay_s: float = 0.0):
    self.delay_s, self.threads = delay_s, []

  def put_block(self, block: Batch) -> Batch:
    time.sleep(self.delay_s)
    self.threads.append(threading.current_thread())
    return {**block, "placed": True}

  def put_index(self, index: int) -> int:
    return index


def _batches(n: int, delay_s: float = 0.0, fail_at: int | None = None, read: list | None = None) -> Iterator[Batch]:
  """Batches 0..n-1 (`x` holds the index), each after `delay_s`; `fail_at` raises OSError instead of that one."""
  for i in range(n):
    time.sleep(delay_s)
    if i == fail_at:
      raise OSError(f"disk gone at batch {i}")
    if read is not None:
      read.append(i)
    yield {"x": np.full([8], i)}


def _x(item: tuple[Batch, int]) -> int:
  """The batch index `x` of the step `item` selects in its block."""
  block, index = item
  return int(block["x"][index][0])


def feeder(backend, batches, depth: int, steps: int = 1) -> feed.Feeder:
  return feed.Feeder(backend, batches, steps, depth)


@pytest.fixture(autouse=True)
def _no_thread_left():
  yield
  gc.collect()
  deadline = time.monotonic() + 5
  while runs.prefetch_threads() and time.monotonic() < deadline:
    time.sleep(0.01)
  assert not runs.prefetch_threads(), "a prefetch thread outlived its iterator"


@pytest.mark.parametrize("depth,steps", [(1, 1), (2, 1), (5, 1), (2, 3), (1, 7)])
def test_every_batch_in_order_placed_once_per_block(depth, steps):
  backend = Placing()
  out = list(feeder(backend, _batches(20), depth, steps))
  assert [_x(i) for i in out] == list(range(20)) and all(b["placed"] for b, _ in out)
  assert len(backend.threads) == -(-20 // steps)  # One transfer per block.


def test_batches_are_read_and_placed_in_one_thread_apart_from_the_loops():
  backend = Placing()
  assert len(list(feeder(backend, _batches(5), 2))) == 5
  assert len(set(backend.threads)) == 1 and backend.threads[0] is not threading.current_thread()


def test_it_reads_ahead_while_the_loop_works_but_no_more_than_size():
  read: list[int] = []
  batches = feeder(Placing(), _batches(100, read=read), 3)
  assert _x(next(batches)) == 0
  time.sleep(0.3)  # The loop's "step": the thread fills the queue meanwhile, then waits.
  assert len(read) in (4, 5)  # The one taken, 3 queued, and at most one read waiting for room.
  batches.close()


def test_a_slow_producer_is_waited_for_in_order():
  backend = Placing(delay_s=0.02)
  out = list(feeder(backend, _batches(10, delay_s=0.01), 2))
  assert [_x(i) for i in out] == list(range(10))


def test_waited_counts_only_batches_not_placed_yet():
  """The loop books `waited` as input: a batch placed ahead is none, however long the loop's thread then waits
  to run; a slow stream's batches are."""
  ready = feeder(Placing(), _batches(4), 8)
  deadline = time.monotonic() + 30
  while ready._queue.qsize() < 5 and time.monotonic() < deadline:  # The thread places all four, then their end.
    time.sleep(0.01)
  assert len(list(ready)) == 4 and ready.waited == 0.0
  slow = feeder(Placing(), _batches(4, delay_s=0.1), 2)
  assert len(list(slow)) == 4 and slow.waited >= 0.3


@pytest.mark.parametrize("depth,steps", [(1, 1), (3, 1), (2, 3)])
def test_an_error_in_the_stream_is_raised_by_the_next_of_its_batch(depth, steps):
  """Also in blocks: the block cut short by the failed read holds the steps before it; the error comes after."""
  batches = feeder(Placing(), _batches(10, fail_at=4), depth, steps)
  assert [_x(next(batches)) for _ in range(4)] == [0, 1, 2, 3]  # Those before it, all of them.
  with pytest.raises(OSError, match="disk gone at batch 4"):
    next(batches)
  with pytest.raises(StopIteration):  # Then the stream is over.
    next(batches)


def test_an_error_in_the_placement_is_raised_in_the_loops_thread():
  class Failing(Placing):
    def put_block(self, block: Batch) -> Batch:
      if int(block["x"][0][0]) == 2:
        raise KeyboardInterrupt  # Anything at all: not lost in the thread.
      return super().put_block(block)

  batches = feeder(Failing(), _batches(10), 2)
  next(batches), next(batches)
  with pytest.raises(KeyboardInterrupt):
    next(batches)


def test_close_stops_a_thread_waiting_for_room_at_once():
  """Not one more read once closed, and no batch left placed: a device batch the queue kept would hold its memory."""
  read: list[int] = []
  batches = feeder(Placing(), _batches(10**6, read=read), 2)
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
  batches = feeder(Placing(), _batches(10**6, delay_s=0.3), 2)
  next(batches)  # The thread is now inside the next slow read.
  batches.close()
  assert not runs.prefetch_threads()


def test_dropping_the_iterator_stops_its_thread():
  batches = feeder(Placing(), _batches(10**6), 2)
  next(batches)
  del batches
  gc.collect()
  deadline = time.monotonic() + 2
  while runs.prefetch_threads() and time.monotonic() < deadline:
    time.sleep(0.01)
  assert not runs.prefetch_threads()


GLOBAL_FEEDER = """
import sys
import numpy as np
import jaxdp
batches = jaxdp.DataParallel().batches({"inputs": np.zeros((64, 4), np.float32), "labels": np.zeros(64, np.int32)},
                                       batch_size=8)
next(batches)
if sys.argv[1] == "closed":
  batches.close()
"""


@pytest.mark.parametrize("how", ["closed", "open"])
def test_a_script_s_global_batches_end_with_it_silently(how):
  # A script's feeder lives until interpreter exit, when it is collected after the modules its `close` reads.
  proc = subprocess.run([sys.executable, "-c", GLOBAL_FEEDER, how], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_device_batches_of_a_real_backend_in_order():
  backend = parallel.make_backend("mesh", 8)
  out = list(feeder(backend, _batches(6), 2, steps=4))
  assert [np.asarray(b["x"][int(i)]).tolist() for b, i in out] == [[i] * 8 for i in range(6)]
  assert all(len(b["x"].addressable_shards) == 8 for b, _ in out)


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


def test_stack_keeps_every_batch_in_order_and_pads_the_last_block():
  out = list(feed.stack(iter(_batches(7)), 3))
  assert [real for _, real in out] == [3, 3, 1]
  assert all(b["x"].shape == (3, 8) for b, _ in out)
  got = np.concatenate([b["x"][:, 0] for b, _ in out])
  np.testing.assert_array_equal(got, [0, 1, 2, 3, 4, 5, 6, 6, 6])  # The last block's padding: copies of step 6.


def test_a_block_of_one_step_is_a_view_of_its_batch():
  """A decoded image batch is never copied on the host to become a block."""
  batch = {"x": np.arange(8.0)}
  (block, real), = feed.stack(iter([batch]), 1)
  assert real == 1 and block["x"].shape == (1, 8) and np.shares_memory(block["x"], batch["x"])


def test_a_failed_read_ends_the_block_and_the_next_one_raises():
  def failing():
    yield from _batches(4)
    raise OSError("disk gone")

  out = feed.stack(failing(), 3)
  assert next(out)[1] == 3
  block, real = next(out)
  assert real == 1 and int(block["x"][0][0]) == 3  # Only step 3's batch is real: no step runs on padding.
  with pytest.raises(OSError, match="disk gone"):
    next(out)


def test_select_takes_the_batch_of_the_index():
  block = {"x": np.arange(4 * 2).reshape(4, 2)}
  picked = parallel.select(lambda state, batch, axis: batch["x"])(None, (block, np.int32(2)), axis=None)
  np.testing.assert_array_equal(picked, [4, 5])


def test_steps_per_block_fits_the_budget(config, monkeypatch):
  ds = data.load(config.dataset)
  assert feed.steps_per_block(ds, 32) == feed.MAX_STEPS  # The default budget holds 64 small batches.
  monkeypatch.setattr(feed, "BLOCK_MIB", 5 * 32 * ROW_BYTES / 2**20)
  assert feed.steps_per_block(ds, 32) == 5
  monkeypatch.setattr(feed, "BLOCK_MIB", 0.5 * 32 * ROW_BYTES / 2**20)
  assert feed.steps_per_block(ds, 32) == 1  # Under one batch: one per step.
  monkeypatch.undo()
  batches = jaxdp.DataParallel.from_config(config).batches(data.load(config.dataset), batch_size=32, stop_step=1)
  assert batches.steps == feed.MAX_STEPS  # What DataParallel.batches, and so the trainer, feeds.
  batches.close()
  # Decoded by tf.data at every step: one per transfer, or a bad example's error would come a block's steps early.
  config.dataset.cache_mb = 0
  assert feed.steps_per_block(data.load(config.dataset), 32) == 1


def _trained(config, workdir, block_steps: int, monkeypatch, stop_at: tuple[int, ...] = ()):
  """Params and logged losses of a run with `block_steps` per transfer, resumed at `stop_at`."""
  monkeypatch.setattr(feed, "BLOCK_MIB", block_steps * config.batch_size * ROW_BYTES / 2**20)
  total = config.num_train_steps
  for stop in (*stop_at, total):
    config.num_train_steps = stop
    result = train_and_evaluate(config, str(workdir))
  config.num_train_steps = total
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  return jax.tree.map(np.asarray, result.params), {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_blocks_train_bitwise_as_one_transfer_per_step_also_resumed_mid_block(config, tmp_path, backend, monkeypatch):
  config.parallel.backend = backend
  config.num_train_steps, config.log_every_steps = 10, 1
  config.lr_schedule, config.warmup_steps = "constant", 3  # Not cosine: stopping early must not change the schedule.
  config.checkpoint_every_steps = 2
  one, one_losses = _trained(config, tmp_path / "one", 1, monkeypatch)
  # Blocks of 3: steps 0-2, 3-5, 6-8, 9 (padded); resumed at 4 and 8: blocks start mid-way through the order.
  three, three_losses = _trained(config, tmp_path / "three", 3, monkeypatch, stop_at=(4, 8))
  assert one_losses == three_losses and len(one_losses) == 10
  jax.tree.map(np.testing.assert_array_equal, one, three)
