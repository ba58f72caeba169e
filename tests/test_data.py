"""The input stream: one seeded global order, sliced per process, resumable at any step."""

import itertools

import numpy as np
import pytest

from jaxdp import data

B = 32


@pytest.fixture(scope="module")
def digits(data_dir):
  import ml_collections
  return data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir}))


def _train(ds, steps, *, seed=0, start=0, process_index=0, process_count=1):
  it = data.train_batches(ds, "train", seed=seed, global_batch=B, start_step=start,
                          process_index=process_index, process_count=process_count)
  return list(itertools.islice(it, steps))


def _global(ds, steps, process_count, **kw):
  """The global batches as the processes of a `process_count`-process run would assemble them."""
  per_process = [_train(ds, steps, process_index=p, process_count=process_count, **kw) for p in range(process_count)]
  return [{k: np.concatenate([pp[s][k] for pp in per_process]) for k in per_process[0][s]} for s in range(steps)]


def _assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def test_same_seed_same_batches(digits):
  _assert_same(_train(digits, 5), _train(digits, 5))


def test_other_seed_other_order(digits):
  assert not np.array_equal(_train(digits, 1)[0]["labels"], _train(digits, 1, seed=1)[0]["labels"])


@pytest.mark.parametrize("process_count", [2, 4, 8])
def test_global_batches_do_not_depend_on_the_process_count(digits, process_count):
  _assert_same(_global(digits, 3, 1), _global(digits, 3, process_count))


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


@pytest.mark.parametrize("process_count", [1, 2, 4])
def test_eval_covers_the_split_once(digits, process_count):
  batches = [list(data.eval_batches(digits, "test[:101]", global_batch=B, process_index=p,
                                    process_count=process_count)) for p in range(process_count)]
  assert {len(b) for b in batches} == {data.num_eval_steps(digits, "test[:101]", B)}  # Same count everywhere.
  masks = np.concatenate([np.concatenate([b["mask"] for b in per]) for per in batches])
  assert masks.sum() == 101 and masks.size == 4 * B
