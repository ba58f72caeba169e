"""The eval stream: every example of a split exactly once, in file order, padded to whole global batches
with `mask` False on the padding; each process reads and decodes only its rows."""

import math
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from jaxdp.data import images, sampler, streamed
from jaxdp.data.dataset import Batch, Dataset
from jaxdp.data.reader import no_autograph, read_steps, to_numpy


def eval_batches(ds: Dataset, split: str, *, global_batch: int, process_index: int,
                 process_count: int) -> Iterator[Batch]:
  """Every example of `split` exactly once, padded to full batches; `mask` marks the real ones."""
  if ds.streamed:
    return streamed.eval_batches(ds, split, global_batch, process_index, process_count)
  source = ds.source(split)
  n = len(source)
  rows = global_batch // process_count
  lo = process_index * rows
  pre = ds.options.preprocess

  def read(step: np.ndarray) -> dict[str, np.ndarray]:
    # Padding repeats real examples from the start (so they decode like any other) with mask False.
    indices, mask = sampler.eval_rows(n, global_batch, int(step), lo, lo + rows)
    return {**source.read(indices), "mask": mask}

  def crop(example: dict) -> dict:
    return {**example, "inputs": images.eval_crop(example["inputs"], pre.image_size, pre.crop_ratio,
                                                  ds.input_shape[-1])}

  def finish(batch: dict) -> dict:
    return pre.finish({k: v for k, v in batch.items() if k not in ("step", "row")})

  probe = {**source.read(np.zeros([1], np.int64)), "mask": np.ones([1], bool)}
  steps = tf.data.Dataset.range(math.ceil(n / global_batch))
  batches = read_steps(ds, probe, steps, read, rows, lo, crop if pre.image_size else None)
  batches = batches.map(no_autograph(finish), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return to_numpy(batches, ds.options.prefetch)


def num_eval_steps(ds: Dataset, split: str, global_batch: int) -> int:
  """Global eval batches that cover `split` once."""
  return math.ceil(ds.num_examples(split) / global_batch)
