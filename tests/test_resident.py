"""The train split held on the devices (jaxdp.resident): each step gathers the rows the host would have gathered,
so training is bitwise that of host batches; a split is held only where it can be (nothing unreadable, no
augmentation, a source that holds it) and where its copies fit parallel.resident_mb."""

import json

import jax
import numpy as np
import pytest

from jaxdp import build, data, resident
from jaxdp.config import ConfigError
from jaxdp.data import held
from jaxdp.data.cache import DecodedSource
from jaxdp.loop.train import train_and_evaluate

DIGITS_ROW = 8 * 8 * 4 + 4  # A digits row as batches hold it: float32 8x8x1 inputs (uint8 / 255), an int32 label.
ID_BYTES = 4


def _trained(config, workdir, resident_mb: float, block_steps: int, stop_at: tuple[int, ...] = (), **objects):
  """Params and logged losses of a run, resumed at `stop_at`: the split held (resident_mb > 0, `block_steps` of row
  ids per transfer), or host batches one per transfer."""
  config.parallel.resident_mb = resident_mb
  config.parallel.block_mb = block_steps * config.batch_size * ID_BYTES / 2**20 if resident_mb else 0
  total = config.num_train_steps
  for stop in (*stop_at, total):
    config.num_train_steps = stop
    result = train_and_evaluate(config, str(workdir), **objects)
  config.num_train_steps = total
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  return jax.tree.map(np.asarray, result.params), {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def _schedule(config) -> None:
  config.num_train_steps, config.log_every_steps = 10, 1
  config.lr_schedule, config.warmup_steps = "constant", 3  # Not cosine: stopping early must not change the schedule.
  config.checkpoint_every_steps = 2


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_a_held_split_trains_bitwise_as_host_batches_also_resumed_mid_block(config, tmp_path, backend):
  config.parallel.backend = backend
  _schedule(config)
  config.parallel.resident_mb = 4  # 8 copies of 0.37 MiB.
  feed = build.build(config).feed
  split = feed.held()  # Made when placed, not kept by the feed (a copy of up to resident_mb on the host).
  assert sorted(split) == ["inputs", "labels"]  # Digits' uint8 images, finished.
  assert split["inputs"].dtype == np.float32 and split["inputs"].max() == 1.0
  host, host_losses = _trained(config, tmp_path / "host", 0, 0)
  # Blocks of 3 steps' ids: steps 0-2, 3-5, 6-8, 9 (padded); resumed at 4 and 8: blocks start mid-way.
  on_devices, losses = _trained(config, tmp_path / "held", 4, 3, stop_at=(4, 8))
  assert losses == host_losses and len(losses) == 10
  jax.tree.map(np.testing.assert_array_equal, host, on_devices)


def test_in_memory_arrays_normalized_and_regressed_train_bitwise_held(config, tmp_path):
  """Arrays from Python: uint8 images normalized by dataset.mean/std and float targets, held whole on 8 devices."""
  rng = np.random.RandomState(0)
  images = rng.randint(0, 256, (200, 4, 4, 2)).astype(np.uint8)
  train = {"inputs": images, "labels": images.mean((1, 2, 3)).astype(np.float32) / 255 + rng.rand(200) * 0.1}
  config.dataset.mean, config.dataset.std = (0.4, 0.6), (0.2, 0.3)
  _schedule(config)
  objects = {"train_data": train, "eval_data": {k: v[:40] for k, v in train.items()}}
  config.parallel.resident_mb = 1
  assert build.build(config, **objects).feed.held is not None
  host, host_losses = _trained(config, tmp_path / "host", 0, 0, **objects)
  on_devices, losses = _trained(config, tmp_path / "held", 1, 4, stop_at=(5,), **objects)
  assert losses == host_losses and len(losses) == 10
  jax.tree.map(np.testing.assert_array_equal, host, on_devices)


def test_a_split_is_held_only_when_its_copies_fit(config):
  ds = data.load(config.dataset)
  size = held.nbytes(ds, "train")
  assert size == 1437 * DIGITS_ROW
  mib = size / 2**20
  assert resident.fits(ds, "train", 8 * mib, 8)
  assert not resident.fits(ds, "train", 8 * mib - 0.01, 8)  # A copy per device: 8 copies must fit.
  assert resident.fits(ds, "train", mib, 1)
  assert not resident.fits(ds, "train", 0, 1)  # 0: never.
  config.parallel.resident_mb = 8 * mib - 0.01
  assert build.build(config).feed.held is None  # Then host batches, in blocks of steps.


def test_augmented_or_unreadable_splits_are_not_held(config):
  config.dataset.flip = True  # Augmented per batch on the host: not the same rows as the split's.
  assert held.nbytes(data.load(config.dataset), "train") is None
  arrays = {"inputs": np.zeros((3, 2), np.float32), "labels": np.zeros(3, np.int32)}
  assert DecodedSource(arrays).held() is arrays
  assert DecodedSource(arrays, bad={1: "not a PNG"}).held() is None  # Its reads name the bad example; held could not.


@pytest.mark.parametrize("value", [-1, float("nan"), "lots", True])
def test_a_bad_resident_mb_is_a_config_error_naming_it(config, value):
  config.parallel.resident_mb = value
  with pytest.raises(ConfigError, match=f"parallel.resident_mb must be 'auto' or a number of MiB >= 0 .*got {value!r}"):
    build.build(config)


def test_the_finished_split_is_made_when_placed_not_kept_from_the_build(config, monkeypatch):
  """Finishing the split (uint8 -> normalized float32 here) copies it: the feed makes it to place it, then drops it."""
  made, finish = [], held.split
  monkeypatch.setattr(held, "split", lambda *args: made.append(args) or finish(*args))
  config.parallel.resident_mb = 4
  parts = build.build(config)
  feed = parts.feed
  assert feed.held is not None and not made  # Deciding to hold the split copied nothing.
  stream = data.train_batches(parts.ds, "train", seed=0, global_batch=config.batch_size, start_step=0,
                              process_index=0, process_count=1, stop_step=2, row_ids=True)
  placed, _ = feed.device_inputs(parts.backend, stream, 0, 0)
  assert len(made) == 1 and not any(isinstance(v, dict) for v in vars(feed).values())
  placed.close()


def test_auto_holds_no_split_on_cpu_where_the_gather_on_the_step_path_cost_more(config):
  assert resident.budget_mib("auto", "cpu") == 0 and resident.budget_mib("auto", "gpu") == resident.AUTO_MIB
  assert resident.budget_mib(512, "cpu") == 512 and resident.budget_mib("2.5", "tpu") == 2.5  # A stored override.
  assert build.build(config).feed.held is None  # The default, on these CPU devices.
  config.parallel.resident_mb = "8"
  assert build.build(config).feed.held is not None


def test_the_gather_takes_the_rows_of_the_states_step():
  class State:
    step = np.int32(6)

  split = {"x": np.arange(10) * 10}
  ids = ({"_rows": np.array([[1, 2], [3, 4], [9, 0]], np.int32)}, np.int32(4))  # Steps 4..6.
  got = resident.select(lambda state, batch, axis: batch["x"])(State(), (ids, split), axis=None)
  np.testing.assert_array_equal(got, [90, 0])  # Step 6 - 4 = 2: rows 9 and 0.


def test_a_block_carries_as_many_steps_of_int32_row_ids_as_fit():
  assert resident.steps_per_block(32, 10 * 32 * ID_BYTES / 2**20) == 10  # 128 bytes a step.
  assert resident.steps_per_block(32, 10.5 * 32 * ID_BYTES / 2**20) == 10
  assert resident.steps_per_block(32, 0) == 1


def test_the_input_line_names_the_copies_the_setting_and_how_blocks_come():
  line = resident.describe(3 * 2**20, 8, 16, "auto", 2)
  assert line == ("the train split held on the devices (3.0 MiB, a copy on each of 8 devices; "
                  "parallel.resident_mb=auto); 16 steps' row ids per transfer, 2 ahead by a thread; "
                  "the step gathers its rows on the devices")
  line = resident.describe(12 * 2**20, 1, 1, 64, 0)
  assert line.startswith("the train split held on the devices (12 MiB; parallel.resident_mb=64); 1 step's row ids per")
  assert "placed when the step asks" in line
