"""A split held decoded is kept in files beside its prepared dataset and mapped by every
later open: the same batches as a decode in memory, decoded again when the dataset or the files change, written
by one of several openers at once, and a folder that cannot hold them leaves the split decoded in memory."""

import glob
import itertools
import logging
import os
import shutil
import threading

import ml_collections
import numpy as np
import pytest

import runs
from jaxdp import data
from jaxdp.data import cache

B = 32


def _load(data_dir: str, **fields) -> data.Dataset:
  return data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir, **fields}))


def _batches(ds: data.Dataset) -> tuple[list[dict], list[dict]]:
  """Six train batches from step 3 (process 1 of 2) and every eval batch."""
  train = data.train_batches(ds, "train", seed=0, global_batch=B, start_step=3, process_index=1, process_count=2)
  evals = data.eval_batches(ds, "test", global_batch=B, process_index=0, process_count=1)
  return list(itertools.islice(train, 6)), list(evals)


@pytest.fixture
def own_dir(data_dir: str, tmp_path) -> str:
  """A copy of the session's prepared `digits` (same files, same times), for this test alone."""
  path = str(tmp_path / "tfds")
  shutil.copytree(data_dir, path, ignore=shutil.ignore_patterns(cache.FOLDER))
  return path


@pytest.fixture
def decodes(monkeypatch) -> list[str]:
  """The splits `cache.decode_all` decodes, in order (each call recorded, then run)."""
  calls, decode_all = [], cache.decode_all

  def counted(source, decode, split):
    calls.append(split)
    return decode_all(source, decode, split)

  monkeypatch.setattr(cache, "decode_all", counted)
  return calls


def _files(data_dir: str, split: str) -> list[str]:
  return sorted(glob.glob(os.path.join(data_dir, "digits", "*", cache.FOLDER, split, "v*")))


def test_a_split_decoded_once_is_mapped_from_its_files_by_every_later_open(own_dir, decodes):
  expected = _batches(_load(own_dir, cache_mb=0))  # Decoded by tf.data at every step: the reference.
  first = _load(own_dir)
  runs.assert_bitwise(_batches(first), expected)
  assert len(decodes) == 2 and _files(own_dir, "train") and _files(own_dir, "test")
  assert all(isinstance(a.base, np.memmap) for a in first.source("train")._arrays.values())  # The writer's too.
  again = _load(own_dir)
  runs.assert_bitwise(_batches(again), expected)
  assert len(decodes) == 2  # Nothing decoded again: mapped.
  arrays = again.source("train")._arrays
  assert all(not a.flags.writeable and isinstance(a.base, np.memmap) for a in arrays.values())


def test_a_dataset_prepared_again_is_decoded_again_and_its_old_files_dropped(own_dir, decodes):
  _batches(_load(own_dir))
  old = _files(own_dir, "train")
  [record] = [f for f in glob.glob(os.path.join(own_dir, "digits", "*", "digits-train.array_record*"))][:1]
  os.utime(record, ns=(os.stat(record).st_atime_ns, os.stat(record).st_mtime_ns + 10**9))
  runs.assert_bitwise(_batches(_load(own_dir)), _batches(_load(own_dir, cache_mb=0)))
  assert decodes == ["train", "test", "train"]  # train again; test's files still hold.
  new = _files(own_dir, "train")
  assert new and not set(old) & set(new)


@pytest.mark.parametrize("damage", ["truncated", "killed_writer"])
def test_files_that_are_incomplete_are_decoded_again(own_dir, decodes, damage):
  expected = _batches(_load(own_dir, cache_mb=0))
  _batches(_load(own_dir))
  [npy] = [f for f in _files(own_dir, "train") if f.endswith(".0.npy")]
  if damage == "truncated":
    os.truncate(npy, os.path.getsize(npy) // 2)
  else:  # Killed after the arrays, before the .json that says they are complete; a temporary file left.
    os.remove(npy[:-len(".0.npy")] + ".json")
    shutil.copy(npy, npy + ".tmp-99999")
  runs.assert_bitwise(_batches(_load(own_dir)), expected)
  assert len(decodes) == 3
  assert not [f for f in _files(own_dir, "train") if ".tmp-" in f]


def test_a_folder_that_cannot_hold_the_files_leaves_the_split_decoded_in_memory(own_dir, decodes, caplog):
  [version_dir] = glob.glob(os.path.join(own_dir, "digits", "*"))
  with open(os.path.join(version_dir, cache.FOLDER), "w"):  # A file where the folder would go.
    pass
  with caplog.at_level(logging.WARNING, logger="jaxdp"):
    runs.assert_bitwise(_batches(_load(own_dir)), _batches(_load(own_dir, cache_mb=0)))
  assert len(decodes) == 2
  assert "dataset split 'train' is decoded in memory: cannot write its decoded copy" in caplog.text


def test_files_written_before_are_mapped_where_the_lock_cannot_be_taken(own_dir, decodes):
  expected = _batches(_load(own_dir, cache_mb=0))
  _batches(_load(own_dir))
  for lock in glob.glob(os.path.join(own_dir, "digits", "*", cache.FOLDER, "*", ".lock")):
    os.remove(lock)
    os.mkdir(lock)  # Not openable for writing (as a read-only folder is not; permissions do not stop root).
  runs.assert_bitwise(_batches(_load(own_dir)), expected)
  assert len(decodes) == 2


def test_openers_at_once_decode_the_split_once_and_read_the_same(own_dir, decodes):
  expected = _batches(_load(own_dir, cache_mb=0))
  datasets = [_load(own_dir) for _ in range(4)]
  results, errors = [None] * 4, []

  def open_split(i: int) -> None:
    try:
      results[i] = _batches(datasets[i])
    except Exception as e:  # Reported below, with the thread's error.
      errors.append(e)

  threads = [threading.Thread(target=open_split, args=(i,)) for i in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(120)
  assert not errors and not any(t.is_alive() for t in threads)
  for result in results:
    runs.assert_bitwise(result, expected)
  assert len(decodes) == 2  # One opener decoded each split; the others waited and mapped its files.


def test_the_files_name_changes_with_the_decoded_features(tmp_path):
  (tmp_path / "a.array_record").write_bytes(b"x")
  files = [str(tmp_path / "a.array_record")]
  digests = {cache.identity("train", files, {"inputs": (shape, dtype)})
             for shape, dtype in [((8, 8, 1), np.float32), ((8, 8, 1), np.uint8), ((8, 8, 3), np.float32)]}
  assert len(digests) == 3


def test_the_files_give_back_the_bad_examples_and_refuse_another_shape(tmp_path):
  stem = str(tmp_path / "v1-abc")
  arrays = {"inputs": np.arange(24, dtype=np.float32).reshape(4, 3, 2), "labels": np.arange(4, dtype=np.int32)}
  cache._write(stem, arrays, {2: "not a JPEG"})
  mapped, bad = cache.read(stem)
  assert bad == {2: "not a JPEG"} and set(mapped) == set(arrays)
  runs.assert_bitwise(mapped, arrays)
  np.save(stem + ".0.npy", arrays["inputs"].reshape(4, 2, 3))  # The same bytes and rows, another shape.
  assert cache.read(stem) is None


def test_a_write_that_fails_leaves_no_temporary_files(tmp_path, caplog):
  arrays = {"inputs": np.zeros((2, 3), np.float32), "text": np.array([["a"], ["b"]], object)}  # Not savable.
  with caplog.at_level(logging.WARNING, logger="jaxdp"):
    held, bad = cache.load_or_decode(str(tmp_path), "train", "abc", lambda: (arrays, {}))
  assert held is arrays and bad == {} and "cannot write its decoded copy" in caplog.text
  left = os.listdir(tmp_path / cache.FOLDER / "train")
  assert left == [".lock"], left
