"""The eval stream: every example of a split exactly once, in file order, padded to whole global batches
with `REAL` (jaxdp.batch) False on the padding; each process reads and decodes only its rows."""

import math
from collections.abc import Iterator

import numpy as np

from jaxdp.data import bad_examples, host_batches, images, sampler, tf_setup
from jaxdp.data.dataset import Batch, Dataset
from jaxdp.data.reader import REAL, drop_row, example_check, probe_row, read_steps, to_numpy


def eval_batches(ds: Dataset, split: str, *, global_batch: int, process_index: int,
                 process_count: int, _tf_data: bool = False) -> Iterator[Batch]:
  """Every example of `split` exactly once, padded to full batches; `REAL` marks the real ones.

  A split with nothing to decode is read by numpy in the caller's thread (`host_batches`); any other through
  tf.data (`_tf_data`: always, for the tests that compare the two).
  """
  source = ds.source(split)
  n = len(source)
  rows = global_batch // process_count
  lo = process_index * rows
  pre = ds.options.preprocess

  def ids(step: int) -> np.ndarray:
    return sampler.eval_rows(n, global_batch, step, lo, lo + rows)[0]

  def read(step: int, swaps: bad_examples.Swaps) -> dict[str, np.ndarray]:
    # Padding repeats real examples from the start (so they decode like any other) with REAL False; so does
    # a bad example's replacement: an eval counts every good example once and a bad one never.
    indices, mask = sampler.eval_rows(n, global_batch, step, lo, lo + rows)
    replaced = swaps.get(step, {})
    mask[list(replaced)] = False
    return {**source.read(bad_examples.swapped(indices, replaced)), REAL: mask}

  def crop(example: dict) -> dict:
    return {**example, "inputs": images.eval_crop(example["inputs"], pre.image_size, ds.input_shape[-1])}


  per_example = crop if pre.image_size else None
  stop = math.ceil(n / global_batch)

  def open_on_host(first: int, swaps: bad_examples.Swaps) -> Iterator[Batch]:
    return host_batches.batches(lambda step: pre.finish(read(step, swaps)), first, stop)

  def open_tf_data(first: int, swaps: bad_examples.Swaps) -> Iterator[Batch]:
    tf = tf_setup.tensorflow()
    probe = {**probe_row(source.read, n), REAL: np.ones([1], bool)}
    steps = tf.data.Dataset.range(first, stop)
    batches = read_steps(ds, probe, steps, lambda step: read(int(step), swaps), rows, lo, per_example)
    return (pre.finish(drop_row(b, "step")) for b in to_numpy(batches))

  check = example_check(ds, per_example)

  def decodes(step: int, row: int, index: int) -> bool:
    def one() -> dict[str, np.ndarray]:
      return {**source.read(np.array([index], np.int64)), REAL: np.ones([1], bool)}

    return check(one, step, lo + row)

  on_host = host_batches.applies(ds) and not _tf_data
  return bad_examples.Guarded(open_on_host if on_host else open_tf_data, ids, decodes, split=split, size=n, start=0,
                              skip=ds.options.skip_bad_examples)


def num_eval_steps(ds: Dataset, split: str, global_batch: int) -> int:
  """Global eval batches that cover `split` once."""
  return math.ceil(ds.num_examples(split) / global_batch)
