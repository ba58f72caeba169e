"""The train stream: this process's rows of global batches start_step, start_step + 1, ... read by index.

Global batch `step` holds the examples at positions [k * B, (k + 1) * B) of epoch `step // steps_per_epoch`'s
permutation (`jaxdp.data.sampler`), k = step % steps_per_epoch. Every process computes the same global
batch, reads rows [p * B / P, (p + 1) * B / P) by index and decodes only those. Nothing proportional to
the split is held in memory but the permutation of its indices. So the sequence of global batches depends
only on the seed and the step, never on how many processes or devices share it, every process gets the
same number of batches per epoch, and the stream is a pure function of the step: **the position to
checkpoint is the train state's step**, and `train_batches(start_step=step)` continues exactly there.
Save the state's step, never a count of batches pulled from the iterator: prefetching reads ahead of the step.

A split with nothing to decode (cached, token file, in-memory, .npz) and no per-example crop is read by numpy in
the caller's thread (`jaxdp.data.host_batches`), any other through tf.data's workers: the same batches either way.

`with_ids=True` adds the feature `reader.INDEX` (int64 [rows]): the position in the split of each example
as it was read, which the audit records; strip it before the step (`jaxdp.loop.audit.Recorder.take_ids`).

"""

from collections.abc import Iterator

import numpy as np

from jaxdp.data import bad_examples, host_batches, images, sampler, tf_setup
from jaxdp.data.dataset import Batch, Dataset
from jaxdp.data.reader import INDEX, drop_row, example_check, probe_row, read_steps, to_numpy

_FOREVER = 2**62  # "Forever": the stream of steps is cut by the number of steps.


def train_order(ds: Dataset, split: str, seed: int, global_batch: int) -> sampler.GlobalOrder:
  """The one global order of the train stream's examples."""
  return sampler.GlobalOrder(ds.num_examples(split), global_batch, seed, split)


def train_batches(ds: Dataset, split: str, *, seed: int, global_batch: int, start_step: int,
                  process_index: int, process_count: int, stop_step: int | None = None,
                  with_ids: bool = False, _tf_data: bool = False) -> Iterator[Batch]:
  """This process's rows of global batches start_step, start_step+1, ..., stop_step - 1 (None: forever).

  `_tf_data`: through tf.data even where the batches could be built on the host (tests compare the two paths).
  A stream that ends lets tf.data's workers finish with it: an endless one is cancelled when it is released,
  which can hold the process's exit (docs/design-notes.md#input-pipeline-choices).
  """
  rows = global_batch // process_count
  first_row = process_index * rows
  source = ds.source(split)
  order = train_order(ds, split, seed, global_batch)
  pre = ds.options.preprocess

  def ids(step: int) -> np.ndarray:
    return order.rows(step, first_row, first_row + rows)

  # The first epoch's order now, in the caller's thread: TensorFlow (which shuffles) loads here, never first in
  # the thread that reads ahead (an import there could meet the main thread's imports).
  ids(start_step)

  def with_index(ids: np.ndarray) -> dict[str, np.ndarray]:
    return {**source.read(ids), INDEX: np.array(ids)} if with_ids else source.read(ids)

  def read(step: int, swaps: bad_examples.Swaps) -> dict[str, np.ndarray]:
    return with_index(bad_examples.swapped(ids(step), swaps.get(step)))

  def crop(example: dict) -> dict:
    key = images.example_seed(seed, example["step"], example["row"])
    x = images.train_crop(example["inputs"], key, pre.image_size, ds.input_shape[-1], pre.flip)
    return {**example, "inputs": x}

  def finish(batch: dict, step: int) -> dict:
    return pre.train(batch, step, seed=seed, global_batch=global_batch, first_row=first_row)

  per_example = crop if pre.image_size else None

  def open_on_host(first: int, swaps: bad_examples.Swaps) -> Iterator[Batch]:
    return host_batches.batches(lambda step: finish(read(step, swaps), step), first, stop_step)

  def open_tf_data(first: int, swaps: bad_examples.Swaps) -> Iterator[Batch]:
    tf = tf_setup.tensorflow()
    steps = tf.data.Dataset.range(first, _FOREVER if stop_step is None else stop_step)
    batches = read_steps(ds, probe_row(with_index, len(source)), steps, lambda step: read(int(step), swaps), rows,
                         first_row, per_example)
    return (finish(b, int(b.pop("step")[0])) for b in map(drop_row, to_numpy(batches)))

  check = example_check(ds, per_example)

  def decodes(step: int, row: int, index: int) -> bool:
    return check(lambda: with_index(np.array([index], np.int64)), step, first_row + row)

  on_host = host_batches.applies(ds) and not _tf_data
  return bad_examples.Guarded(open_on_host if on_host else open_tf_data, ids, decodes, split=split, size=len(source),
                              start=start_step, skip=ds.options.skip_bad_examples)
