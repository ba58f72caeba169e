"""Blocks of steps per transfer (jaxdp.blocks): the same batches, so bitwise the same training, as one per step."""

import json

import jax
import numpy as np
import pytest

from jaxdp import blocks, build, data
from jaxdp.loop.train import train_and_evaluate

ROW_BYTES = 8 * 8 * 4 + 4  # A digits row as batches hold it: float32 8x8x1 inputs, an int32 label.


def _batches(n: int):
  return [{"inputs": np.full((4, 2), s, np.float32), "labels": np.full((4,), s, np.int32)} for s in range(n)]


def test_stack_keeps_every_batch_in_order_and_pads_the_last_block():
  out = list(blocks.stack(iter(_batches(7)), 3, first_step=5))
  assert [(int(first), real) for (_, first), real in out] == [(5, 3), (8, 3), (11, 1)]
  assert all(b["inputs"].shape == (3, 4, 2) and b["labels"].shape == (3, 4) for (b, _), _ in out)
  got = np.concatenate([b["labels"][:, 0] for (b, _), _ in out])
  np.testing.assert_array_equal(got, [0, 1, 2, 3, 4, 5, 6, 6, 6])  # The last block's padding: copies of step 6.


def test_a_failed_read_ends_the_block_and_the_next_one_raises():
  def failing():
    yield from _batches(4)
    raise OSError("disk gone")

  out = blocks.stack(failing(), 3, first_step=0)
  assert next(out)[1] == 3
  (block, first), real = next(out)
  assert (int(first), real) == (3, 1)  # Only step 3's batch is real: the step after it never runs on padding.
  with pytest.raises(OSError, match="disk gone"):
    next(out)


def test_repeat_gives_each_block_once_per_real_step():
  assert list(blocks.repeat(iter([("a", 3), ("b", 1)]))) == list("aaab")


def test_select_takes_the_batch_of_the_states_step():
  class State:
    step = np.int32(9)

  block = ({"x": np.arange(4 * 2).reshape(4, 2)}, np.int32(7))  # Steps 7..10.
  picked = blocks.select(lambda state, batch, axis: batch["x"])(State(), block, axis=None)
  np.testing.assert_array_equal(picked, [4, 5])  # Row 9 - 7 = 2.


def test_steps_per_block_fits_the_budget(config):
  ds = data.load(config.dataset)
  assert blocks.steps_per_block(ds, 32, 0) == 1
  assert blocks.steps_per_block(ds, 32, 5 * 32 * ROW_BYTES / 2**20) == 5
  assert blocks.steps_per_block(ds, 32, 1e6) == blocks.MAX_STEPS
  assert blocks.steps_per_block(ds, 32, 0.5 * 32 * ROW_BYTES / 2**20) == 1  # Under one batch: one per step.
  config.parallel.resident_mb = 0  # Host batches: the split is not held on the devices (test_resident.py).
  assert build.build(config).feed.steps == blocks.MAX_STEPS  # The default budget holds 64 small batches.
  # Decoded by tf.data at every step: one per transfer, or a bad example's error would come a block's steps early.
  config.dataset.cache_mb = 0
  assert blocks.steps_per_block(data.load(config.dataset), 32, 1e6) == 1


def _trained(config, workdir, block_steps: int, stop_at: tuple[int, ...] = ()):
  """Params and logged losses of a run with `block_steps` per transfer (0: one per step), resumed at `stop_at`."""
  config.parallel.block_mb = block_steps * config.batch_size * ROW_BYTES / 2**20
  config.parallel.resident_mb = 0  # Host batches, in blocks: a split held on the devices is test_resident.py's.
  total = config.num_train_steps
  for stop in (*stop_at, total):
    config.num_train_steps = stop
    result = train_and_evaluate(config, str(workdir))
  config.num_train_steps = total
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  return jax.tree.map(np.asarray, result.params), {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_blocks_train_bitwise_as_one_transfer_per_step_also_resumed_mid_block(config, tmp_path, backend):
  config.parallel.backend = backend
  config.num_train_steps, config.log_every_steps = 10, 1
  config.lr_schedule, config.warmup_steps = "constant", 3  # Not cosine: stopping early must not change the schedule.
  config.checkpoint_every_steps = 2
  one, one_losses = _trained(config, tmp_path / "one", 0)
  # Blocks of 3: steps 0-2, 3-5, 6-8, 9 (padded); resumed at 4 and 8: blocks start mid-way through the order.
  three, three_losses = _trained(config, tmp_path / "three", 3, stop_at=(4, 8))
  assert one_losses == three_losses and len(one_losses) == 10
  jax.tree.map(np.testing.assert_array_equal, one, three)
