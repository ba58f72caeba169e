"""In-memory data (issue 24): `data.load(config.dataset, train_data=..., eval_data=...)` with a dict of numpy arrays
or a random-access source, read by index in the global order like any dataset, nothing written to a TFDS
directory, fingerprinted by the resume guard."""

import itertools
import os

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

import jaxdp.datasets  # noqa: F401  Registers digits.
from jaxdp import data
from jaxdp.batch import INDEX, REAL
from jaxdp.config import ConfigError

B, STEPS = 8, 9  # 60 train examples: 7 steps an epoch, so STEPS crosses into a second epoch.


def _arrays(n, seed=0):
  rng = np.random.RandomState(seed)
  return {"inputs": rng.randn(n, 3), "labels": rng.randn(n), "mask": rng.rand(n, 4) > 0.5,
          "meta": {"id": np.arange(n) + 1000 * seed}}


class Rows:
  """A random-access source of example dicts read one at a time (`__getitem__` only)."""

  def __init__(self, arrays):
    self.arrays = arrays

  def __len__(self):
    return len(self.arrays["inputs"])

  def __getitem__(self, i):
    return {"inputs": self.arrays["inputs"][i], "labels": self.arrays["labels"][i], "mask": self.arrays["mask"][i],
            "meta": {"id": self.arrays["meta"]["id"][i]}, "text": f"row {i}"}


class BatchedRows(Rows):
  """The same, read a batch of indices at a time (`__getitems__`, as tfds and Hugging Face sources)."""

  def __getitems__(self, indices):
    return [self[i] for i in indices]


def _load(train=None, test=None, **fields):
  return data.load(ml_collections.ConfigDict(fields), train_data=train, eval_data=test)


def _train(ds, process_index=0, process_count=1):
  stream = data.train_batches(ds, "train", seed=1, global_batch=B, start_step=0, process_index=process_index,
                              process_count=process_count, with_ids=True)
  return list(itertools.islice(stream, STEPS))


def _global(ds, process_count):
  per = [_train(ds, p, process_count) for p in range(process_count)]
  return [{k: np.concatenate([pp[s][k] for pp in per]) for k in per[0][s]} for s in range(STEPS)]


def _assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert sorted(x) == sorted(y)
    for k in x:
      assert x[k].dtype == y[k].dtype, k
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.mark.parametrize("wrap", [dict, Rows, BatchedRows])
def test_in_memory_data_is_read_by_index_in_the_global_order(wrap):
  train, test = _arrays(60), _arrays(21, seed=1)
  ds = _load(wrap(train), wrap(test))
  assert ds.name.startswith("<in-memory>@") and ds.float_labels and ds.input_shape == (3,)
  spec = ds.element_spec()
  assert sorted(spec) == ["inputs", "labels", "mask", "meta/id"]  # Text left out; nested keys flattened.
  assert spec["inputs"].dtype == np.float32 and spec["labels"].dtype == np.float32 and spec["meta/id"].dtype == np.int32
  one = _global(ds, 1)
  _assert_same(one, _global(ds, 2))  # 1 and 2 processes: the same global batches.
  epoch = np.concatenate([b[INDEX] for b in one[:7]])
  assert sorted(epoch) == sorted(set(epoch)) and len(epoch) == 56  # An epoch reads each example at most once.
  for batch in one:
    i = batch[INDEX]
    np.testing.assert_allclose(batch["inputs"], train["inputs"][i].astype(np.float32))
    np.testing.assert_array_equal(batch["labels"], train["labels"][i].astype(np.float32))
    np.testing.assert_array_equal(batch["mask"], train["mask"][i])
    np.testing.assert_array_equal(batch["meta/id"], train["meta"]["id"][i])
  seen = []
  for p in range(2):
    for batch in data.eval_batches(ds, "test", global_batch=B, process_index=p, process_count=2):
      seen += list(batch["meta/id"][batch[REAL]])
  assert sorted(seen) == list(range(1000, 1021))  # Every eval example once.


def test_a_tfds_data_source_reads_as_its_arrays(data_dir):
  """A `tfds.data_source` (examples decoded by TFDS) gives the batches of the same examples as arrays."""
  source = tfds.data_source("digits", data_dir=data_dir, split="train")
  examples = [source[i] for i in range(len(source))]
  arrays = {k: np.stack([e[k] for e in examples]) for k in examples[0]}
  from_source, from_arrays = _load(source), _load(arrays)
  assert sorted(from_source.element_spec()) == ["image", "label"]  # No "inputs"/"labels": its own names.
  _assert_same(_train(from_source), _train(from_arrays))


def test_nothing_is_written_to_a_tfds_directory(tmp_path, monkeypatch):
  home, tfds_dir, data_dir = tmp_path / "home", tmp_path / "tfds_env", tmp_path / "data_dir"
  for d in (home, tfds_dir, data_dir):
    d.mkdir()
  monkeypatch.setenv("HOME", str(home))
  monkeypatch.setenv("TFDS_DATA_DIR", str(tfds_dir))
  ds = _load(_arrays(60), _arrays(21, seed=1), data_dir=str(data_dir), cache_mb=64)
  _train(ds)
  list(data.eval_batches(ds, "test", global_batch=B, process_index=0, process_count=1))
  data.stream_spec(ds, "train", seed=1, global_batch=B, process_count=1)
  assert [os.listdir(d) for d in (home, tfds_dir, data_dir)] == [[], [], []]


def test_the_resume_guard_refuses_changed_data():
  def spec(train):
    return data.stream_spec(_load(train), "train", seed=1, global_batch=B, process_count=1)

  saved = spec(_arrays(60))
  assert saved["dataset"].startswith("<in-memory>@") and saved["source"] == "in-memory"
  data.check_resume(saved, spec(_arrays(60)))  # The same data (another copy): resumes.
  changed = _arrays(60)
  changed["labels"][17] += 1e-3  # One value of one array.
  with pytest.raises(ConfigError, match="dataset '<in-memory>@"):
    data.check_resume(saved, spec(changed))
  with pytest.raises(ConfigError, match="dataset '<in-memory>@"):
    data.check_resume(saved, spec(BatchedRows(changed)))  # A source's sample of rows holds row 17's label too.


@pytest.mark.parametrize("train, words", [
    ({"inputs": np.zeros((4, 2)), "labels": np.zeros(3)}, ["train_data", "one leading length", "(3,)"]),
    ([1, 2, 3], ["train_data", "an example must be a dict", "int"]),
    (object(), ["train_data", "random-access source", "object"]),
])
def test_bad_in_memory_data_is_a_config_error_naming_it(train, words):
  with pytest.raises(ConfigError) as e:
    _load(train)
  assert all(w in str(e.value) for w in words), str(e.value)


def test_splits_of_different_features_are_a_config_error():
  test = _arrays(8)
  del test["mask"]
  with pytest.raises(ConfigError, match="different features"):
    _load(_arrays(60), test)
