"""Reading by index (`jaxdp.data.reader`; on the host, `jaxdp.data.stream`): one
source read per step, whatever the features."""

import threading

import ml_collections
import numpy as np
import pytest

from jaxdp import data
from jaxdp.batch import INDEX, REAL
from jaxdp.data import stream
from jaxdp.data.dataset import Dataset, Options
from jaxdp.data.source import ArrayCorpus, Facts, UnreadableExample

N, B = 40, 8


class CountingSource:
  """N examples of 4 float features and a label; counts its reads (from any thread)."""

  def __init__(self):
    self.reads, self._lock = 0, threading.Lock()

  def __len__(self) -> int:
    return N

  def read(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    with self._lock:
      self.reads += 1
    indices = np.asarray(indices, np.int64)
    return {"inputs": np.repeat(indices[:, None], 4, 1).astype(np.float32), "labels": (indices % 3).astype(np.int32)}


@pytest.fixture
def counted() -> tuple[Dataset, CountingSource]:
  source = CountingSource()
  facts = Facts("counting", (4,), (), 3)
  return Dataset(ArrayCorpus(facts, {"train": source, "test": source}), Options(), kind="counting"), source


@pytest.mark.parametrize("tf_data", [False, True])
def test_the_train_stream_reads_once_per_step(counted, tf_data):
  ds, source = counted
  steps = 10
  batches = list(data.train_batches(ds, "train", seed=0, global_batch=B, start_step=0, process_index=0,
                                    process_count=1, stop_step=steps, _tf_data=tf_data))
  assert len(batches) == steps
  assert source.reads == steps + tf_data  # tf.data: and one probe for the types.


@pytest.mark.parametrize("tf_data", [False, True])
def test_the_eval_stream_reads_once_per_step(counted, tf_data):
  ds, source = counted
  batch = 12  # 40 examples: 4 steps, the last one padded (a third key: REAL).
  batches = list(data.eval_batches(ds, "test", global_batch=batch, process_index=0, process_count=1,
                                   _tf_data=tf_data))
  assert len(batches) == -(-N // batch)
  assert source.reads == len(batches) + tf_data
  assert sum(int(b[REAL].sum()) for b in batches) == N


@pytest.mark.parametrize("fields", [{"cache_mb": 0}, {}], ids=["decoded_by_tf_data", "held_decoded"])
def test_each_rows_id_comes_through_the_decode(data_dir, fields):
  ds = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir, **fields}))
  held = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir})).source("train")
  order = stream.train_order(ds, "train", 0, 32)
  batches = data.train_batches(ds, "train", seed=0, global_batch=32, start_step=0, process_index=1, process_count=2,
                               stop_step=3, with_ids=True)
  for step, batch in enumerate(batches):
    np.testing.assert_array_equal(batch[INDEX], order.rows(step, 16, 32))
    np.testing.assert_array_equal(batch["labels"], held.read(batch[INDEX])["labels"])


class UnreadableAtFive(CountingSource):
  """CountingSource whose example 5 is known not to decode (as a split held decoded says of a bad image)."""

  def read(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    if 5 in np.asarray(indices):
      raise UnreadableExample("example 5 of split 'train': not a JPEG")
    return super().read(indices)


@pytest.mark.parametrize("tf_data", [False, True])
def test_an_unreadable_example_fails_its_step_and_is_never_read_as_another(tf_data):
  source = UnreadableAtFive()
  ds = Dataset(ArrayCorpus(Facts("unreadable", (4,), (), 3), {"train": source, "test": source}), Options(),
               kind="unreadable")
  batches = data.train_batches(ds, "train", seed=0, global_batch=N, start_step=0, process_index=0, process_count=1,
                               stop_step=1, _tf_data=tf_data)  # One step: every example, 5 among them.
  with pytest.raises(Exception, match="example 5 of split 'train'.*not a JPEG"):
    next(batches)
