"""The train stream: this process's rows of global batches start_step, start_step + 1, ... read by index.

Global batch `step` holds the examples at positions [k * B, (k + 1) * B) of epoch `step // steps_per_epoch`'s
permutation (`jaxdp.data.sampler`), k = step % steps_per_epoch. Every process computes the same global
batch, reads rows [p * B / P, (p + 1) * B / P) by index and decodes only those. Nothing proportional to
the split is held in memory but the permutation of its indices. So the sequence of global batches depends
only on the seed and the step, never on how many processes or devices share it, every process gets the
same number of batches per epoch, and the stream is a pure function of the step: **the position to
checkpoint is the train state's step**, and `train_batches(start_step=step)` continues exactly there.
Save the state's step, never a count of batches pulled from the iterator: prefetching reads ahead of the step.

`dataset.shard_by_process` (opt in): each process reads only its own 1/P of the split, reshuffled per
epoch (`sampler.ShardOrder`, by index; or, for a dataset prepared as TFRecord only, `jaxdp.data.streamed`).

`with_ids=True` adds the feature `reader.INDEX` (int64 [rows]): the position in the split of each example
as it was read, which the audit records; strip it before the step (`jaxdp.loop.audit.Recorder.take_ids`).
"""

from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from jaxdp.data import bad_examples, images, sampler, streamed
from jaxdp.data.dataset import Batch, Dataset
from jaxdp.data.reader import INDEX, example_decodes, no_autograph, probe_row, read_steps, to_numpy

_FOREVER = 2**62  # "Forever": the stream of steps is cut by the number of steps.


def train_order(ds: Dataset, split: str, seed: int, global_batch: int, process_index: int,
                process_count: int) -> sampler.GlobalOrder | sampler.ShardOrder:
  """The order of the train stream's examples: one global order, or (dataset.shard_by_process) this process's
  shard order; under the streaming fallback only its steps_per_epoch holds (its shards are as large)."""
  if ds.options.shard_by_process:
    return sampler.ShardOrder(ds.num_examples(split), global_batch // process_count, seed, split, process_index,
                              process_count)
  return sampler.GlobalOrder(ds.num_examples(split), global_batch, seed, split)


def train_batches(ds: Dataset, split: str, *, seed: int, global_batch: int, start_step: int,
                  process_index: int, process_count: int, stop_step: int | None = None,
                  with_ids: bool = False) -> Iterator[Batch]:
  """This process's rows of global batches start_step, start_step+1, ..., stop_step - 1 (None: forever).

  A stream that ends lets tf.data's workers finish with it: an endless one is cancelled when it is released,
  which can hold the process's exit for seconds (experiments/data_notes.md).
  """
  rows = global_batch // process_count
  first_row = process_index * rows
  if ds.streamed:
    return streamed.train_batches(ds, split, seed, global_batch, start_step, process_index, process_count, stop_step,
                                  with_ids)
  source = ds.source(split)
  order = train_order(ds, split, seed, global_batch, process_index, process_count)
  pre = ds.options.preprocess

  def ids(step: int) -> np.ndarray:
    return order.rows(step, first_row, first_row + rows)

  def with_index(ids: np.ndarray) -> dict[str, np.ndarray]:
    return {**source.read(ids), INDEX: ids} if with_ids else source.read(ids)

  def crop(example: dict) -> dict:
    key = images.example_seed(seed, example["step"], example["row"])
    x = images.train_crop(example["inputs"], key, pre.image_size, ds.input_shape[-1], pre.flip)
    return {**example, "inputs": x}

  def finish(batch: dict) -> dict:
    batch = pre.train(batch, batch.pop("step")[0], seed=seed, global_batch=global_batch, first_row=first_row)
    del batch["row"]
    return batch

  per_example = crop if pre.image_size else None
  probe = probe_row(with_index, len(source))

  def open_from(first: int, swaps: bad_examples.Swaps) -> Iterator[Batch]:
    def read(step: np.ndarray) -> dict[str, np.ndarray]:
      return with_index(bad_examples.swapped(ids(int(step)), swaps.get(int(step))))

    steps = tf.data.Dataset.range(first, _FOREVER if stop_step is None else stop_step)
    batches = read_steps(ds, probe, steps, read, rows, first_row, per_example)
    batches = batches.map(no_autograph(finish), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return to_numpy(batches, ds.options.prefetch)

  def decodes(step: int, row: int, index: int) -> bool:
    return example_decodes(ds, lambda: with_index(np.array([index], np.int64)), step, first_row + row, per_example)

  return bad_examples.Guarded(open_from, ids, decodes, split=split, size=len(source), start=start_step,
                              skip=ds.options.skip_bad_examples)
