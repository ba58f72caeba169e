"""Batches built by numpy on the host (`jaxdp.data.stream.on_host`) are bitwise those of the tf.data path, for every
kind of split with nothing to decode: train (1 and several processes, resumed, with ids) and eval; bad examples and
failing reads are reported alike."""

import itertools

import ml_collections
import numpy as np
import pytest
import tensorflow as tf

import bad_datasets  # noqa: F401  `bad_datasets:BadPngs`.
import batches
from jaxdp import data
from jaxdp.data import cache, reader, stream
from jaxdp.data.preprocess import Preprocess
from jaxdp.data.source import ArrayCorpus
from jaxdp.datasets import token_file
from jaxdp.runtime import exits

STEPS = 30


def _train(ds, *, host: bool, start: int = 0, steps: int = STEPS, batch: int = 16, process_index: int = 0,
           process_count: int = 1, with_ids: bool = True) -> list:
  stream = data.train_batches(ds, "train", seed=3, global_batch=batch, start_step=start, process_index=process_index,
                              process_count=process_count, with_ids=with_ids, _tf_data=not host)
  return list(itertools.islice(stream, steps))


def _eval(ds, *, host: bool, batch: int = 16, process_index: int = 0, process_count: int = 1, split: str = "test"):
  return list(data.eval_batches(ds, split, global_batch=batch, process_index=process_index,
                                process_count=process_count, _tf_data=not host))


def _assert_both_paths_agree(ds, batch: int = 16, eval_split: str = "test") -> None:
  """Train (1 and 2 processes' rows, resumed at a step, with and without ids) and eval batches: bitwise the same."""
  assert stream.on_host(ds)
  for kwargs in ({}, {"process_index": 1, "process_count": 2}, {"start": 7, "steps": 9}, {"with_ids": False}):
    batches.assert_same(_train(ds, host=True, batch=batch, **kwargs), _train(ds, host=False, batch=batch, **kwargs))
  for p, count in ((0, 1), (0, 2), (1, 2)):
    batches.assert_same(_eval(ds, host=True, batch=batch, process_index=p, process_count=count, split=eval_split),
                        _eval(ds, host=False, batch=batch, process_index=p, process_count=count, split=eval_split))


def _digits(data_dir, **fields):
  return data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir, **fields}))


def test_a_cached_split_reads_the_same_batches_on_the_host(data_dir):
  ds = _digits(data_dir)
  assert isinstance(ds.corpus, cache.CachedCorpus)
  _assert_both_paths_agree(ds)


@pytest.mark.parametrize("fields", [{"crop_padding": 2, "flip": True}, {"flip": True, "mean": (0.4,), "std": (0.3,)},
                                    {"crop_padding": 3, "mean": (0.5,)}])
def test_augmented_and_normalized_cached_batches_are_the_same_on_the_host(data_dir, fields):
  _assert_both_paths_agree(_digits(data_dir, **fields))


def test_a_token_file_reads_the_same_batches_on_the_host(tmp_path):
  path = str(tmp_path / "t.bin")
  token_file.write((np.arange(5000) * 7) % 300, path, vocab_size=300)
  ds = data.load(ml_collections.ConfigDict({"name": "token_file", "builder_kwargs": {"path": path, "seq_len": 12}}))
  _assert_both_paths_agree(ds, batch=12)


def test_in_memory_arrays_read_the_same_batches_on_the_host():
  rng = np.random.RandomState(0)

  def arrays(n):
    return {"inputs": rng.randint(0, 256, (n, 6, 5, 3)).astype(np.uint8), "labels": rng.randint(0, 7, n),
            "weight": rng.randn(n), "count": rng.randint(-2**40, 2**40, (n, 2)), "mask": rng.rand(n, 4) > 0.5,
            "half": rng.randn(n, 2).astype(np.float16)}

  config = ml_collections.ConfigDict({"mean": (0.1, 0.2, 0.3), "std": (0.7, 0.5, 0.3), "crop_padding": 1,
                                      "flip": True})
  ds = data.load(config, train_data=arrays(70), eval_data=arrays(23))
  _assert_both_paths_agree(ds)
  floats = data.load(ml_collections.ConfigDict({"mean": (0.5,)}), train_data={"inputs": rng.randn(40, 3),
                                                                                 "labels": rng.randn(40)},
                     eval_data={"inputs": rng.randn(9, 3), "labels": rng.randn(9)})
  _assert_both_paths_agree(floats, batch=8)


def test_an_npz_file_reads_the_same_batches_on_the_host(tmp_path):
  rng = np.random.RandomState(1)
  path = str(tmp_path / "d.npz")
  np.savez(path, x=rng.randn(90, 4), y=rng.randint(0, 3, 90), extra=rng.randint(0, 9, (90, 2)))
  ds = data.load(ml_collections.ConfigDict({"name": path, "data_dir": str(tmp_path / "tfds"), "std": (2.0,)}))
  assert isinstance(ds.corpus, ArrayCorpus) and ds.corpus.decode is None
  _assert_both_paths_agree(ds, batch=8)


def test_the_host_path_uses_no_tf_data(data_dir, monkeypatch):
  ds = _digits(data_dir)

  def refused(*args, **kwargs):
    raise AssertionError("the host path went through tf.data")

  monkeypatch.setattr(reader, "read_steps", refused)
  monkeypatch.setattr(reader, "to_numpy", refused)
  assert len(_train(ds, host=True, steps=3)) == 3 and _eval(ds, host=True)


def test_finish_is_one_float32_multiply_add_and_the_casts_a_device_holds():
  """`finish` on extreme values and every dtype the streams cast."""
  pre = Preprocess(mean=(0.3, 0.6, 0.9), std=(0.11, 0.7, 3.0))
  rng = np.random.RandomState(2)
  batch = {"inputs": rng.randint(0, 256, (4, 3, 2, 3)).astype(np.uint8), "labels": rng.randint(0, 9, 4),
           "f64": rng.randn(4) * 1e30, "u64": rng.randint(0, 2**62, 4).astype(np.uint64), "b": rng.rand(4) > 0.5,
           "_index": np.arange(4, dtype=np.int64)}
  host = pre.finish(batch)
  scale, offset = (np.asarray(a, np.float32) for a in pre.affine(np.uint8))
  want = {**{k: v.astype(host[k].dtype) for k, v in batch.items()},
          "inputs": batch["inputs"].astype(np.float32) * scale - offset}
  batches.assert_same([host], [want])
  np.testing.assert_allclose(host["inputs"], (batch["inputs"] / 255 - (0.3, 0.6, 0.9)) / (0.11, 0.7, 3.0), rtol=1e-5)
  # As a device holds them: 64-bit narrowed to 32, integer labels int32; jaxdp's own keys as they are.
  assert {k: v.dtype.name for k, v in host.items()} == {"inputs": "float32", "labels": "int32", "f64": "float32",
                                                        "u64": "uint32", "b": "bool", "_index": "int64"}
  floats = {"inputs": rng.randn(4, 3) * 1e3}
  scale, offset = pre.affine(np.float64)
  batches.assert_same([pre.finish(floats)], [{"inputs": floats["inputs"].astype(np.float32) * scale - offset}])


def test_normalizing_on_the_host_never_writes_into_the_rows_it_was_given():
  """A float32 batch may be a view of the split itself (held in memory): it is normalized in a copy."""
  rows = np.arange(6, dtype=np.float32).reshape(2, 3)
  before = rows.copy()
  out = Preprocess(mean=(1.0,), std=(2.0,)).finish({"inputs": rows})
  np.testing.assert_array_equal(rows, before)
  np.testing.assert_array_equal(out["inputs"], (before - 1.0) / 2.0)


def _bad_pngs(data_dir, **fields):
  fields = {"name": "bad_datasets:BadPngs", "data_dir": str(data_dir), "builder_kwargs": {"bad_train": (5, 17),
            "bad_test": (3,)}, **fields}
  return data.load(ml_collections.ConfigDict(fields))


def test_a_bad_example_of_a_cached_split_is_named_alike_on_both_paths(tmp_path):
  ds = _bad_pngs(tmp_path)
  assert isinstance(ds.corpus, cache.CachedCorpus) and stream.on_host(ds)
  messages = []
  for host in (True, False):
    with pytest.raises(data.BadExampleError) as train_error:
      _train(ds, host=host, steps=8)
    with pytest.raises(data.BadExampleError) as eval_error:
      _eval(ds, host=host, batch=8)
    messages.append((str(train_error.value), str(eval_error.value)))
  assert messages[0] == messages[1] and "cannot decode example" in messages[0][0], messages


def test_bad_examples_of_a_cached_split_are_replaced_alike_on_both_paths(tmp_path):
  ds = _bad_pngs(tmp_path, skip_bad_examples=True)
  for process_index, process_count in ((0, 1), (1, 2)):
    streams = [data.train_batches(ds, "train", seed=0, global_batch=16, start_step=0, process_index=process_index,
                                  process_count=process_count, with_ids=True, _tf_data=not host)
               for host in (True, False)]
    host, tf_data = (list(itertools.islice(s, 8)) for s in streams)
    batches.assert_same(host, tf_data)
    assert data.skipped_through(streams[0], 7) == data.skipped_through(streams[1], 7) > 0
  batches.assert_same(_eval(ds, host=True, batch=8), _eval(ds, host=False, batch=8))


class FailingSource:
  """40 examples; once `broken`, reading example 13 raises, as a user's broken source would."""
  broken = False

  def __len__(self) -> int:
    return 40

  def __getitem__(self, i: int) -> dict:
    if self.broken and i == 13:
      raise ValueError("cannot read example 13")
    return {"inputs": np.full([2], i, np.float32), "labels": np.int64(i % 3)}


def test_a_failing_read_names_the_sources_error_on_both_paths():
  """tf.data's worker failure is one `error:` line naming the source's exception and its frame; the host path raises
  its own `ReadError`, caused by the source's exception, naming it and the step, and is the same one line."""
  source = FailingSource()
  ds = data.load(ml_collections.ConfigDict({}), train_data=source)  # Its digest reads every row.
  source.broken = True
  with pytest.raises(tf.errors.OpError) as error:
    _train(ds, host=False, steps=10, batch=8)
  summary = exits.input_failure(error.value)
  assert summary[0].startswith("an input worker failed: ValueError: cannot read example 13 (at "), summary
  with pytest.raises(data.ReadError, match=r"step \d+ failed: ValueError: cannot read example 13") as error:
    _train(ds, host=True, steps=10, batch=8)
  assert isinstance(error.value.__cause__, ValueError)
  assert exits.input_failure(error.value)[0] == summary[0], (exits.input_failure(error.value), summary)


def test_a_host_stream_pulled_from_another_thread_reads_the_same_batches(data_dir):
  """The device prefetch may pull the host iterator from its own thread: one thread at a time, any thread."""
  import concurrent.futures
  ds = _digits(data_dir, flip=True, crop_padding=2)  # Augmented: its draws are made in that thread too.
  expected = _train(ds, host=False, steps=70)
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    for _ in range(10):
      stream = data.train_batches(ds, "train", seed=3, global_batch=16, start_step=0, process_index=0,
                                  process_count=1, with_ids=True)
      batches.assert_same([pool.submit(next, stream).result() for _ in range(70)], expected)


def test_decoded_by_says_none_on_the_host_else_why_tf_data_decodes(data_dir):
  """`data.decoded_by`: None where numpy makes the batches; else tf.data, and why the split is not held decoded."""
  arrays = {"inputs": np.zeros((8, 2), np.float32), "labels": np.zeros(8, np.int64)}
  assert data.decoded_by(data.load(ml_collections.ConfigDict({}), train_data=arrays)) is None
  assert data.decoded_by(_digits(data_dir)) is None  # Small: decoded once, then gathered on the host.
  why = data.decoded_by(_digits(data_dir, cache_mb=0))
  assert why.startswith("batches decoded by tf.data: dataset.cache_mb=0 (its splits take ") and "MiB decoded" in why
  why = data.decoded_by(_digits(data_dir, cache_mb=0.01))
  assert why.endswith("more than dataset.cache_mb=0.01 MiB holds in memory"), why
