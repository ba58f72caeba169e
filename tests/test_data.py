"""The input stream: one seeded global order, sliced per process and device, resumable at any step;
augmentation keyed by the example's position; exactly-once eval; the opt-in per-process shards."""

import contextlib
import itertools

import ml_collections
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from jaxdp import data, parallel
from jaxdp.batch import REAL
from jaxdp.config import ConfigError
from jaxdp.data import cache, preprocess, reader
from jaxdp.data.preprocess import Preprocess, batch_dtype

B = 32
MOCK_EXAMPLES = 96  # Mocked cifar10: 6 global batches of 16 per epoch.
CIFAR = {"name": "cifar10", "crop_padding": 4, "flip": True, "mean": (0.5, 0.4, 0.3), "std": (0.2, 0.25, 0.3)}


@pytest.fixture(scope="module")
def digits(data_dir):
  """digits read by index (its small decoded copy in memory off: the path any dataset size takes)."""
  return data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir, "cache_mb": 0}))


def _train(ds, steps, *, seed=0, start=0, process_index=0, process_count=1, batch=B, split="train"):
  it = data.train_batches(ds, split, seed=seed, global_batch=batch, start_step=start,
                          process_index=process_index, process_count=process_count)
  return list(itertools.islice(it, steps))


def _global(ds, steps, process_count, **kw):
  """The global batches as the processes of a `process_count`-process run would assemble them."""
  per_process = [_train(ds, steps, process_index=p, process_count=process_count, **kw) for p in range(process_count)]
  return [{k: np.concatenate([pp[s][k] for pp in per_process]) for k in per_process[0][s]} for s in range(steps)]


@contextlib.contextmanager
def _cifar(tmp_path, **fields):
  """Mocked cifar10 (random images, no download) with CIFAR augmentation, loaded inside the mock."""
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
    yield data.load(ml_collections.ConfigDict({**CIFAR, "data_dir": str(tmp_path), **fields}))


def _assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      assert x[k].dtype == y[k].dtype, k
      np.testing.assert_array_equal(x[k], y[k])


def test_same_seed_same_batches(digits):
  _assert_same(_train(digits, 5), _train(digits, 5))


def test_other_seed_other_order(digits):
  assert not np.array_equal(_train(digits, 1)[0]["labels"], _train(digits, 1, seed=1)[0]["labels"])


@pytest.mark.parametrize("process_count", [2, 4, 8])
def test_global_batches_do_not_depend_on_the_process_count(digits, process_count):
  _assert_same(_global(digits, 3, 1), _global(digits, 3, process_count))


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_one_two_and_eight_devices_see_the_same_global_batches(digits, backend):
  host = _train(digits, 3)
  seen = {}
  for n in (1, 2, 8):
    be = parallel.make_backend(backend, n)
    seen[n] = [{k: _device_rows(v, be.local_devices, b[k].shape[1:]) for k, v in be.put_batch(b).items()}
               for b in host]
  _assert_same(seen[1], host)
  _assert_same(seen[2], host)
  _assert_same(seen[8], host)


def _device_rows(array, devices, row_shape):
  """Each device's rows of a device batch, concatenated in the backend's device order."""
  by_device = {s.device: np.asarray(s.data).reshape(-1, *row_shape) for s in array.addressable_shards}
  assert len(by_device) == len(devices)
  return np.concatenate([by_device[d] for d in devices])


def test_batches_are_decoded_and_typed(digits):
  batch = _train(digits, 1)[0]
  assert batch["inputs"].shape == (B, 8, 8, 1) and batch["inputs"].dtype == np.float32
  assert 0.0 <= batch["inputs"].min() and batch["inputs"].max() <= 1.0 and batch["inputs"].max() > 0.5
  assert batch["labels"].dtype == np.int32 and set(batch["labels"]) <= set(range(10))


def test_an_epoch_sees_every_example_at_most_once_and_epochs_differ(digits):
  steps_per_epoch = digits.num_examples("train") // B  # 44
  batches = _train(digits, 2 * steps_per_epoch)
  first = np.concatenate([b["inputs"] for b in batches[:steps_per_epoch]]).reshape(-1, 64)
  assert len(np.unique(first, axis=0)) >= 0.97 * len(first)  # A few digits images are exact duplicates.
  second = np.concatenate([b["inputs"] for b in batches[steps_per_epoch:]]).reshape(-1, 64)
  assert not np.array_equal(first, second)


@pytest.mark.parametrize("k", [3, 44, 50])  # Mid-epoch, at the epoch boundary, in the second epoch.
def test_resume_continues_with_the_next_batch(digits, k):
  straight = _train(digits, k + 2)
  resumed = _train(digits, 2, start=k)
  _assert_same(straight[k:], resumed)


def test_augmented_stream_is_deterministic_resumable_and_process_count_invariant(tmp_path):
  with _cifar(tmp_path) as ds:
    straight = _global(ds, 8, 1, batch=16)           # Crosses an epoch boundary (6 steps per epoch).
    _assert_same(straight, _global(ds, 8, 1, batch=16))
    _assert_same(straight, _global(ds, 8, 8, batch=16))
    _assert_same(straight[5:], _global(ds, 3, 2, batch=16, start=5))
    other_seed = _global(ds, 1, 1, batch=16, seed=1)
  assert not np.array_equal(straight[0]["inputs"], other_seed[0]["inputs"])


def test_augmentation_and_normalization_are_applied(tmp_path):
  with _cifar(tmp_path, crop_padding=0, flip=False, mean=(), std=()) as plain_ds:
    plain = _train(plain_ds, 6, batch=16)
  with _cifar(tmp_path) as aug_ds:
    augmented = _train(aug_ds, 6, batch=16)
  raw = np.concatenate([b["inputs"] for b in plain])
  out = np.concatenate([b["inputs"] for b in augmented])
  # Undo the normalization: what is left is raw, shifted by up to 4 pixels, maybe mirrored, zero-padded.
  out = out * np.array(CIFAR["std"]) + np.array(CIFAR["mean"])
  matched = [_crop_and_flip_of(o, r) for o, r in zip(out, raw)]
  assert all(m is not None for m in matched)
  offsets = {m[:2] for m in matched}
  assert len(offsets) > 10 and {m[2] for m in matched} == {False, True}  # Crops and flips vary per example.


def _crop_and_flip_of(out, raw, pad=4):
  """(dy, dx, flipped) with out == that crop of zero-padded raw, or None."""
  padded = np.pad(raw, [(pad, pad), (pad, pad), (0, 0)])
  for flipped in (False, True):
    src = padded[:, ::-1] if flipped else padded
    for dy in range(2 * pad + 1):
      for dx in range(2 * pad + 1):
        if np.allclose(src[dy:dy + 32, dx:dx + 32], out, atol=1e-5):
          return dy, dx, flipped
  return None


def test_crop_and_flip_at_known_draws():
  x = (np.arange(2 * 4 * 5).reshape(2, 4, 5, 1) % 251 + 1).astype(np.uint8)
  pre = Preprocess(crop_padding=2, flip=True)
  # Row 0: offset 0 (shifted down-right by 2, zeros enter), no flip. Row 1: offset 2 (unchanged), flipped.
  out = pre.augment(x, np.array([[0.0, 0.0, 0.9], [0.5, 0.5, 0.1]], np.float32))
  np.testing.assert_array_equal(out[0, 2:, 2:], x[0, :-2, :-2])
  assert (out[0, :2] == 0).all() and (out[0, :, :2] == 0).all()
  np.testing.assert_array_equal(out[1], x[1, :, ::-1])


def test_a_rows_draws_are_keyed_by_seed_step_and_global_row():
  """Rows [2, 4) of global batch `step` take rows [2, 4) of that step's draws: the same on any process count; other
  steps and seeds draw anew."""
  x = (np.arange(4 * 6 * 6).reshape(4, 6, 6, 1) % 251).astype(np.uint8)
  pre = Preprocess(crop_padding=2, flip=True)
  one = pre.train({"inputs": x}, 5, seed=1, global_batch=4, first_row=0)["inputs"]
  half = pre.train({"inputs": x[2:]}, 5, seed=1, global_batch=4, first_row=2)["inputs"]
  np.testing.assert_array_equal(one[2:], half)
  np.testing.assert_array_equal(one, pre.finish({"inputs": pre.augment(x, preprocess.draws(1, 4, 5))})["inputs"])
  for step, seed in ((6, 1), (5, 2)):
    assert not np.array_equal(one, pre.train({"inputs": x}, step, seed=seed, global_batch=4, first_row=0)["inputs"])
  draws = preprocess.draws(1, 4, 5)
  assert draws.dtype == np.float32 and draws.shape == (4, 3) and (draws >= 0).all() and (draws < 1).all()


def test_eval_is_not_augmented(tmp_path):
  with _cifar(tmp_path) as aug_ds:
    augmented = list(data.eval_batches(aug_ds, "test", global_batch=32, process_index=0, process_count=1))
  with _cifar(tmp_path, crop_padding=0, flip=False) as plain_ds:
    plain = list(data.eval_batches(plain_ds, "test", global_batch=32, process_index=0, process_count=1))
  _assert_same(augmented, plain)


@pytest.mark.parametrize("process_count", [1, 2, 4])
def test_eval_covers_the_split_once(digits, process_count):
  split = "test[:101]"
  batches = [list(data.eval_batches(digits, split, global_batch=B, process_index=p,
                                    process_count=process_count)) for p in range(process_count)]
  assert {len(b) for b in batches} == {data.num_eval_steps(digits, split, B)}  # Same count everywhere.
  masks = np.concatenate([np.concatenate([b[REAL] for b in per]) for per in batches])
  assert masks.sum() == 101 and masks.size == 4 * B
  # The unmasked rows of all processes are exactly the split's examples (as a multiset).
  seen = np.concatenate([b["inputs"][b[REAL]].reshape(-1, 64) for per in batches for b in per])
  truth = np.concatenate([b["inputs"][b[REAL]].reshape(-1, 64) for b in
                          data.eval_batches(digits, split, global_batch=101, process_index=0, process_count=1)])
  assert len(truth) == 101
  np.testing.assert_array_equal(_sorted_rows(seen), _sorted_rows(truth))


def _sorted_rows(x):
  return x[np.lexsort(x.T[::-1])]


def test_stream_spec_guards_resume(digits):
  spec = data.stream_spec(digits, "train", seed=0, global_batch=B)
  data.check_resume(spec, data.stream_spec(digits, "train", seed=0, global_batch=B))
  with pytest.raises(ConfigError, match="global_batch 32 -> 64"):
    data.check_resume(spec, data.stream_spec(digits, "train", seed=0, global_batch=2 * B))


@pytest.mark.parametrize("fields, message", [
    ({"mean": (0.1, 0.2)}, "dataset.mean"),
    ({"std": (0.0,)}, "dataset.std must be positive"),
    ({"crop_padding": -1}, "dataset.crop_padding"),
    ({"image_size": -1}, "dataset.image_size"),
    ({"cache_mb": -1}, "dataset.cache_mb"),
    ({"cache_mb": "lots"}, "dataset.cache_mb must be 'auto' or a number of MiB >= 0 .*got 'lots'"),
    ({"cache_mb": True}, "dataset.cache_mb"),
    ({"cache_mb": float("nan")}, "dataset.cache_mb"),
])
def test_bad_fields_are_config_errors(data_dir, fields, message):
  with pytest.raises(ConfigError, match=message):
    ds = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir, **fields}))
    _train(ds, 1)


def test_a_small_dataset_decoded_in_memory_gives_the_same_batches(digits, data_dir):
  """Under `cache_mb` the splits are decoded once; train (any process, resumed) and eval batches keep every bit."""
  cached = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir}))  # Default cache_mb.
  assert isinstance(cached.corpus, cache.CachedCorpus) and not isinstance(digits.corpus, cache.CachedCorpus)
  too_big = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir, "cache_mb": 0.1}))
  assert not isinstance(too_big.corpus, cache.CachedCorpus)  # 1,797 decoded 8x8 images: 0.12 MiB.
  steps = 60  # Past an epoch (44 batches of 32): the second epoch's order too.
  _assert_same(_train(cached, steps, start=3, process_index=1, process_count=2),
               _train(digits, steps, start=3, process_index=1, process_count=2))
  _assert_same(list(data.eval_batches(cached, "test", global_batch=B, process_index=0, process_count=1)),
               list(data.eval_batches(digits, "test", global_batch=B, process_index=0, process_count=1)))
  assert data.stream_spec(cached, "train", seed=0, global_batch=B) == data.stream_spec(
      digits, "train", seed=0, global_batch=B)


@pytest.mark.parametrize("memory_gib, budget", [(8, 512.0), (12, 768.0), (16, 1024.0), (256, 1024.0)])
def test_the_auto_cache_budget_is_a_share_of_the_machines_memory_up_to_a_gib(monkeypatch, memory_gib, budget):
  """"auto": the smaller of 1 GiB and 1/16 of the memory (each process of a host holds its own copy)."""
  monkeypatch.setattr(data.dataset, "memory_bytes", lambda: memory_gib * 2**30)
  assert data.dataset.cache_budget_mib("auto") == budget
  assert data.Options(cache_mb="auto").cache_budget_mib == budget


@pytest.mark.parametrize("setting, mib", [(0, 0.0), (64, 64.0), (12.5, 12.5), ("200", 200.0), ("0.5", 0.5)])
def test_a_cache_budget_given_as_a_number_is_that_many_mib(setting, mib):
  """A number, or its text (an override of a stored config's "auto" arrives as text), as it is."""
  assert data.dataset.cache_budget_mib(setting) == mib


def test_the_machines_memory_is_its_containers_limit_when_lower(monkeypatch, tmp_path):
  limit, unlimited = tmp_path / "memory.max", tmp_path / "unlimited"
  limit.write_text("1073741824\n")
  unlimited.write_text("max\n")
  monkeypatch.setattr(data.dataset, "_CGROUP_LIMITS", (str(unlimited), str(limit)))
  assert data.dataset.memory_bytes() == 2**30
  monkeypatch.setattr(data.dataset, "_CGROUP_LIMITS", (str(unlimited), str(tmp_path / "absent")))
  assert data.dataset.memory_bytes() > 2**30  # The machine's own memory (no test machine has 1 GiB or less).


def test_a_dataset_is_held_decoded_when_its_splits_fit_the_budget(data_dir):
  """The decision reads the dataset's decoded size: 1,797 digits, each 8x8 uint8 pixels and an int64 label."""
  corpus = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir, "cache_mb": 0})).corpus
  mib = corpus.decoded_mib()
  assert mib == pytest.approx(1797 * (8 * 8 + 8) / 2**20)
  assert isinstance(cache.maybe_cached(corpus, mib), cache.CachedCorpus)
  assert cache.maybe_cached(corpus, 0.99 * mib) is corpus
  assert cache.maybe_cached(corpus, 0) is corpus


def test_the_start_summary_says_why_a_dataset_is_decoded_each_step(data_dir):
  """The input line names the dataset's decoded size and the setting that keeps it out of memory."""
  from jaxdp import feed
  small = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir, "cache_mb": 0.05}))
  line = feed.describe(small, 32, 1, 2)
  assert "batches decoded by tf.data: its splits take 0.1 MiB decoded, more than dataset.cache_mb=0.05 MiB" in line
  off = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir, "cache_mb": 0}))
  assert "dataset.cache_mb=0 (its splits take 0.1 MiB decoded)" in feed.describe(off, 32, 1, 2)
  cached = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir}))
  assert feed.describe(cached, 32, 64, 2).startswith("64 steps' batches per transfer (nothing to decode)")


def test_a_stream_with_a_stop_step_ends_there_with_the_same_batches(digits):
  """`stop_step` (the loop passes num_train_steps) ends the stream: the same batches as the endless one, then none."""
  it = data.train_batches(digits, "train", seed=0, global_batch=B, start_step=3, process_index=0, process_count=1,
                          stop_step=7)
  _assert_same(list(it), _train(digits, 4, start=3))


def test_streams_are_not_autotuned():
  # Deleting an autotuned iterator at a stream's end waited 2-4 s for tf.data's autotuning thread (in about
  # 1 of 3 two-process runs): the loop stood still at the last step, and every eval's end risks the same.
  batches = reader.prefetched(tf.data.Dataset.range(4).map(lambda x: x, num_parallel_calls=tf.data.AUTOTUNE))
  assert batches.options().autotune.enabled is False
  assert list(batches.as_numpy_iterator()) == [0, 1, 2, 3]


def _preprocess(input_shape: tuple, **fields) -> Preprocess:
  from jaxdp import config as config_lib
  from jaxdp.configs import default
  dataset = config_lib.with_defaults(default.get_config()).dataset
  dataset.update(fields)
  return Preprocess.from_config(dataset, input_shape)


@pytest.mark.parametrize("input_shape, fields, message", [
    ((8, 8, 1), {"mean": (0.1, 0.2, 0.3)}, "dataset.mean .* needs 1 or 1 values"),
    ((64,), {"image_size": 32}, "need images"),
    ((None, None, 3), {"image_size": 32, "crop_padding": 4}, "crop_padding \\(4\\) is for fixed-size images"),
])
def test_preprocessing_that_does_not_fit_the_inputs_is_a_config_error(input_shape, fields, message):
  with pytest.raises(ConfigError, match=message):
    _preprocess(input_shape, **fields)


def test_preprocessing_that_fits_the_inputs():
  assert _preprocess((4, 4, 4), mean=(0.1, 0.2, 0.3, 0.4), std=(1.0,) * 4).mean == (0.1, 0.2, 0.3, 0.4)
  varying = _preprocess((None, None, 3), image_size=32, flip=True)
  assert varying.flip and not varying.augments  # Flipped per example with its crop, not per batch.
  assert batch_dtype("labels", np.uint8) == np.int32 and batch_dtype("labels", np.float64) == np.float32


@pytest.mark.parametrize("cache_mb", [0, "auto"])
def test_an_unknown_split_is_a_config_error_naming_it(data_dir, cache_mb):
  ds = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir, "cache_mb": cache_mb}))
  with pytest.raises(ConfigError, match="unknown split 'tran' of dataset 'digits'"):
    ds.source("tran")


def test_nested_features_are_named_by_their_whole_path():
  from jaxdp.data.source import flatten
  assert flatten({"scene": {"camera": {"pose": 1}, "depth": 2}, "label": 3}) == {
      "scene/camera/pose": 1, "scene/depth": 2, "label": 3}
