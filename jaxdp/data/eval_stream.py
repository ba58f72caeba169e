"""The eval stream: every example of a split exactly once, in file order, padded to whole global batches
with `REAL` (jaxdp.batch) False on the padding; each process reads and decodes only its rows."""

import math
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from jaxdp.data import bad_examples, images, sampler, streamed
from jaxdp.data.dataset import Batch, Dataset
from jaxdp.data.reader import REAL, example_decodes, no_autograph, probe_row, read_steps, to_numpy


def eval_batches(ds: Dataset, split: str, *, global_batch: int, process_index: int,
                 process_count: int) -> Iterator[Batch]:
  """Every example of `split` exactly once, padded to full batches; `REAL` marks the real ones."""
  if ds.streamed:
    return streamed.eval_batches(ds, split, global_batch, process_index, process_count)
  source = ds.source(split)
  n = len(source)
  rows = global_batch // process_count
  lo = process_index * rows
  pre = ds.options.preprocess

  def ids(step: int) -> np.ndarray:
    return sampler.eval_rows(n, global_batch, step, lo, lo + rows)[0]

  def crop(example: dict) -> dict:
    return {**example, "inputs": images.eval_crop(example["inputs"], pre.image_size, pre.crop_ratio,
                                                  ds.input_shape[-1])}

  def finish(batch: dict) -> dict:
    return pre.finish({k: v for k, v in batch.items() if k not in ("step", "row")})

  per_example = crop if pre.image_size else None
  probe = {**probe_row(source.read, n), REAL: np.ones([1], bool)}

  def open_from(first: int, swaps: bad_examples.Swaps) -> Iterator[Batch]:
    def read(step: np.ndarray) -> dict[str, np.ndarray]:
      # Padding repeats real examples from the start (so they decode like any other) with REAL False; so does
      # a bad example's replacement: an eval counts every good example once and a bad one never.
      indices, mask = sampler.eval_rows(n, global_batch, int(step), lo, lo + rows)
      replaced = swaps.get(int(step), {})
      mask[list(replaced)] = False
      return {**source.read(bad_examples.swapped(indices, replaced)), REAL: mask}

    steps = tf.data.Dataset.range(first, math.ceil(n / global_batch))
    batches = read_steps(ds, probe, steps, read, rows, lo, per_example)
    batches = batches.map(no_autograph(finish), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return to_numpy(batches, ds.options.prefetch)

  def decodes(step: int, row: int, index: int) -> bool:
    def one() -> dict[str, np.ndarray]:
      return {**source.read(np.array([index], np.int64)), REAL: np.ones([1], bool)}

    return example_decodes(ds, one, step, lo + row, per_example)

  return bad_examples.Guarded(open_from, ids, decodes, split=split, size=n, start=0,
                              skip=ds.options.skip_bad_examples)


def num_eval_steps(ds: Dataset, split: str, global_batch: int) -> int:
  """Global eval batches that cover `split` once."""
  return math.ceil(ds.num_examples(split) / global_batch)
