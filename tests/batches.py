"""Host batches of a dataset as each process of a run reads them, and their comparison (shared by the data tests)."""

import itertools

import numpy as np

from jaxdp import data


def train(ds, *, seed: int, global_batch: int, steps: int, process_index: int = 0, process_count: int = 1) -> list:
  """The first `steps` train batches this process reads (with the example ids)."""
  stream = data.train_batches(ds, "train", seed=seed, global_batch=global_batch, start_step=0,
                              process_index=process_index, process_count=process_count, with_ids=True)
  return list(itertools.islice(stream, steps))


def global_batches(ds, process_count: int, **kwargs) -> list:
  """The global batches as the processes of a `process_count`-process run assemble them."""
  per = [train(ds, process_index=p, process_count=process_count, **kwargs) for p in range(process_count)]
  return [{k: np.concatenate([pp[s][k] for pp in per]) for k in per[0][s]} for s in range(len(per[0]))]


def nan_inputs_at(stream, steps: set[int], start_step: int):
  """`stream` with float32 inputs, NaN at the global steps in `steps`: uint8 inputs (kept uint8 for the devices) cast
  NaN to 0, so every batch is made float32 and the block keeps one dtype."""
  for step, batch in enumerate(stream, start_step):
    inputs = batch["inputs"].astype(np.float32)
    yield {**batch, "inputs": np.full_like(inputs, np.nan) if step in steps else inputs}


def assert_same(a: list, b: list) -> None:
  """The same batches: the same features, dtypes and values."""
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert sorted(x) == sorted(y)
    for k in x:
      assert x[k].dtype == y[k].dtype, k
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)
