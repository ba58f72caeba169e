"""The streaming fallback (dataset.shard_by_process on a dataset prepared as TFRecord only) resumes exactly:
`train_batches(start_step=k)` continues the stream at step k, within an epoch and across epoch boundaries."""

import itertools

import ml_collections
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import runs
from jaxdp.datasets import digits  # noqa: F401  (defining its builder registers "digits" with TFDS)
from jaxdp.tools import audit
from jaxdp import data, train
from jaxdp.data import convert, streamed
from jaxdp.data.reader import INDEX, REAL


def _streamed(path: str, **fields) -> data.Dataset:
  return data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": path, "shard_by_process": True,
                                              "shuffle_buffer": 64, **fields}))


def test_the_streamed_train_stream_resumes_at_any_step(tfrecord_dir):
  ds = _streamed(tfrecord_dir)
  assert ds.streamed

  def stream(start: int, steps: int, stop: int | None = None) -> list[dict]:
    # 1437 examples, 2 processes: 718 in this process's shard, 5 batches of 128 per epoch.
    it = data.train_batches(ds, "train", seed=3, global_batch=256, start_step=start, process_index=1,
                            process_count=2, stop_step=stop)
    return list(itertools.islice(it, steps))

  whole = stream(0, 12)
  assert not np.array_equal(whole[0]["labels"], whole[5]["labels"])  # Epoch 1 is reshuffled.
  for start in (3, 5, 7):  # Mid-epoch 0, the first step of epoch 1, mid-epoch 1.
    runs.assert_bitwise(stream(start, 12 - start), whole[start:])
  # The stream ends at stop_step (the run's last step), within an epoch or at its end, and nowhere else.
  for start, stop in ((0, 12), (3, 4), (3, 10), (7, 11), (5, 6)):
    runs.assert_bitwise(stream(start, 99, stop), whole[start:stop])


def test_the_streamed_audit_records_the_examples_the_stream_delivered(config, tmp_path):
  path = str(tmp_path / "tfrecord")  # Its own copy, not tfrecord_dir: converted below.
  builder = tfds.builder("digits", data_dir=path, file_format="tfrecord")
  builder.download_and_prepare()
  config.update(batch_size=256, num_train_steps=7, audit_data=True)  # 5 steps per epoch: into the second.
  config.dataset.update(data_dir=path, shard_by_process=True, shuffle_buffer=64)
  train.train_and_evaluate(config, str(tmp_path / "run"))
  assert "steps 1..7 in 1 segment(s)" in audit.check(str(tmp_path / "run"))  # Each example once per epoch.
  recorded = [e.ids for e in audit.lineage(audit.load(str(tmp_path / "run")))]
  ds = data.load(config.dataset)
  assert ds.streamed
  delivered = list(data.train_batches(ds, "train", seed=config.seed, global_batch=256, start_step=0, process_index=0,
                                      process_count=1, stop_step=7, with_ids=True))
  assert len(recorded) == len(delivered) == 7
  assert convert.convert(str(builder.data_dir))  # The same records, now also read by index.
  by_index = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": path})).source("train")
  for ids, batch in zip(recorded, delivered):
    np.testing.assert_array_equal(ids, batch[INDEX])
    rows = by_index.read(ids)  # Each recorded id is the example the stream delivered in that row.
    np.testing.assert_array_equal(np.round(batch["inputs"] * 255).astype(np.uint8), rows["inputs"])
    np.testing.assert_array_equal(batch["labels"], rows["labels"])


def test_each_process_shuffles_its_shard_its_own_way(tfrecord_dir):
  ds = _streamed(tfrecord_dir)
  ids = [next(data.train_batches(ds, "train", seed=3, global_batch=256, start_step=0, process_index=p,
                                 process_count=2, with_ids=True))[INDEX] for p in range(2)]
  shard = 1437 // 2  # Process 1's shard starts at 718: the same draws would give it the same offsets.
  assert ids[0].max() < shard <= ids[1].min()
  assert not np.array_equal(ids[0], ids[1] - shard)


def test_a_slice_of_a_split_streams_its_positions_in_the_slice(tfrecord_dir):
  ds = _streamed(tfrecord_dir)
  batches = data.train_batches(ds, "train[100:]", seed=0, global_batch=64, start_step=0, process_index=0,
                               process_count=1, stop_step=20, with_ids=True)  # 1337 examples: 20 steps of 64.
  ids = np.concatenate([b[INDEX] for b in batches])
  assert len(ids) == len(set(ids.tolist())) == 1280 and ids.min() >= 0 and ids.max() < 1337


def test_the_streamed_eval_splits_the_padded_batches_between_processes(tfrecord_dir):
  ds = _streamed(tfrecord_dir)
  whole = list(data.eval_batches(ds, "test", global_batch=64, process_index=0, process_count=1))
  halves = [list(data.eval_batches(ds, "test", global_batch=64, process_index=p, process_count=2)) for p in range(2)]
  assert len(whole) == 6 and sum(int(b[REAL].sum()) for b in whole) == 360  # 384 rows, 24 of them padding.
  for b, first, second in zip(whole, *halves):
    for k in b:
      np.testing.assert_array_equal(b[k], np.concatenate([first[k], second[k]]))


def test_a_failure_to_find_the_bad_examples_leaves_the_streams_own_error():
  def failing():
    raise tf.errors.DataLossError(None, None, "corrupted record at 12")
    yield

  def bad() -> list[int]:
    raise RuntimeError("cannot read the split again")

  with pytest.raises(tf.errors.DataLossError, match="corrupted record at 12"):
    next(streamed._Named(failing(), bad, "train"))
