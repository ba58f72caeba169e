"""`dataset.shard_by_process` on a dataset prepared as TFRecord only (no reads by index): the streaming fallback.

Train: each process streams its own file shards (`tfds.split_for_jax_process`) through a shuffle buffer,
reshuffled per epoch; deterministic for a given seed and process count, but the global batches then change
with the process count. `with_ids`: each example's position in the split as delivered (from its `tfds_id`,
the file and the record in it; the same position as reads by index after `jaxdp.data.convert`). Eval: the
split in file order, padded, each process keeping its rows.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow_datasets as tfds

from jaxdp.config import ConfigError
from jaxdp.data import bad_examples, sampler, tf_setup
from jaxdp.data.dataset import Batch, Dataset
from jaxdp.data.reader import INDEX, REAL, no_autograph, to_numpy
from jaxdp.data.source import INPUTS, FeatureNames

if TYPE_CHECKING:  # Annotations only: TensorFlow is imported where it is used.
  import tensorflow as tf

CONVERT = "python -m jaxdp.data.convert DIR"  # Adds ArrayRecord files to a TFRecord-prepared dataset.


def train_batches(ds: Dataset, split: str, seed: int, global_batch: int, start_step: int, process_index: int,
                  process_count: int, stop_step: int | None = None, with_ids: bool = False) -> Iterator[Batch]:
  """This process's own file shards streamed through a shuffle buffer, shuffled per epoch, up to `stop_step`
  (None: forever); depends on the process count."""
  tf = tf_setup.tensorflow()
  rows = global_batch // process_count
  first_row = process_index * rows
  shard = tfds.split_for_jax_process(split, process_index=process_index, process_count=process_count,
                                     drop_remainder=True)  # Equal shards: the same batches per epoch everywhere.
  n = ds.builder.info.splits[shard].num_examples
  steps_per_epoch = sampler.steps_per_epoch(n, rows, f"{split} (this process's shard)")
  first_epoch, skip = divmod(start_step, steps_per_epoch)
  pre = ds.options.preprocess
  if pre.image_size:
    raise ConfigError("dataset.shard_by_process does not crop images of varying size; read by index instead")
  as_example = _with_position(ds.builder, split) if with_ids else FeatureNames(ds.builder.info)

  def finish(batch: dict, step: tf.Tensor) -> dict:
    return pre.train(batch, step, seed=seed, global_batch=global_batch, first_row=first_row)

  def epoch(e: int) -> Iterator[Batch]:
    epoch_seed = (seed * 1_000_003 + e * 7_919 + process_index) % 2**31
    examples = ds.builder.as_dataset(split=shard, shuffle_files=True,
                                     read_config=tfds.ReadConfig(shuffle_seed=epoch_seed, add_tfds_id=with_ids))
    examples = examples.map(no_autograph(as_example))
    examples = examples.shuffle(ds.options.shuffle_buffer, seed=epoch_seed, reshuffle_each_iteration=False)
    batches = examples.batch(rows, drop_remainder=True).take(steps_per_epoch)
    batches = batches.enumerate(start=e * steps_per_epoch).map(no_autograph(lambda step, b: (b, step)))
    skipped = skip if e == first_epoch else 0
    start = e * steps_per_epoch + skipped  # This epoch's first step here.
    batches = batches.skip(skipped).take(-1 if stop_step is None else stop_step - start)
    batches = batches.map(no_autograph(finish), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return to_numpy(batches, ds.options.prefetch)

  last_epoch = None if stop_step is None else -(-stop_step // steps_per_epoch)
  epochs = itertools.count(first_epoch) if last_epoch is None else range(first_epoch, last_epoch)
  return _Named(itertools.chain.from_iterable(map(epoch, epochs)), lambda: _bad(ds.builder, shard, split), split)


class _Named(Iterator[Batch]):
  """A stream's batches; a failed decode raises `BadExampleError` naming the bad examples of this process's shard
  by position in `split` (`bad()`): the shuffle buffer decodes ahead, so the failing step need not hold them.
  Replacing them (dataset.skip_bad_examples) needs reads by index."""

  def __init__(self, batches: Iterator[Batch], bad: Callable[[], list[int]], split: str):
    self._batches, self._bad, self.split = batches, bad, split

  def __next__(self) -> Batch:
    tf = tf_setup.tensorflow()
    try:
      return next(self._batches)
    except tf.errors.OpError as e:
      try:
        bad = self._bad()
      except Exception:  # The read itself fails, not a decode: the stream's error says so.
        bad = []
      if not bad:
        raise
      raise bad_examples.named_error(self.split, bad, e, remedy=f"convert the dataset to read it by index, where "
                                     f"dataset.skip_bad_examples replaces bad examples ({CONVERT})") from None


def _bad(builder: tfds.core.DatasetBuilder, part: Any, split: str) -> list[int]:
  """The positions in `split` of the examples of `part` (`split` or this process's shard of it) whose input does
  not decode, each decoded alone."""
  tf = tf_setup.tensorflow()
  x = builder.info.supervised_keys[0]
  raw = builder.as_dataset(split=part, shuffle_files=False, decoders={x: tfds.decode.SkipDecoding()},
                           read_config=tfds.ReadConfig(add_tfds_id=True))
  positions = raw.map(no_autograph(_with_position(builder, split)))
  feature = builder.info.features[x]
  # The decoded input is an output: a shape alone of a fixed-size image would let TensorFlow skip the decode.
  decoded = positions.map(no_autograph(lambda ex: (ex[INDEX], feature.decode_example(ex[INPUTS]))),
                          num_parallel_calls=tf.data.AUTOTUNE)
  every = {int(i) for i in tfds.as_numpy(positions.map(no_autograph(lambda ex: ex[INDEX])))}
  return sorted(every - {int(i) for i, _ in tfds.as_numpy(decoded.ignore_errors())})


def _with_position(builder: tfds.core.DatasetBuilder, split: str) -> Callable[[dict], dict]:
  """A decoded example with its `tfds_id` -> its features (`FeatureNames`) and INDEX: its position in `split` (in
  file order)."""
  tf = tf_setup.tensorflow()
  files = builder.info.splits[split].file_instructions  # `split` may be a slice such as "train[10%:]".
  names = [os.path.basename(f.filename) for f in files]
  starts = np.cumsum([0, *(f.take for f in files[:-1])]) - [f.skip for f in files]  # Position of record 0 of a file.
  first = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(names, starts.astype(np.int64)), -1)
  names = FeatureNames(builder.info)

  def position(example: dict) -> dict:
    tfds_id = example["tfds_id"]  # "FILE__RECORD": the shard's file name and the record's index in it.
    record = tf.strings.to_number(tf.strings.regex_replace(tfds_id, "^.*__", ""), tf.int64)
    return {**names(example), INDEX: first.lookup(tf.strings.regex_replace(tfds_id, "__[0-9]+$", "")) + record}

  return position


def eval_batches(ds: Dataset, split: str, global_batch: int, process_index: int,
                 process_count: int) -> Iterator[Batch]:
  """The split streamed in file order, padded, each process decoding its rows."""
  n = ds.num_examples(split)
  padded = math.ceil(n / global_batch) * global_batch
  names = FeatureNames(ds.builder.info)
  tf_setup.tensorflow()  # Before TFDS's `as_dataset` loads TensorFlow.
  examples = ds.builder.as_dataset(split=split, shuffle_files=False)
  examples = examples.repeat().take(padded).enumerate()
  examples = examples.map(no_autograph(lambda i, ex: {**names(ex), REAL: i < n}))
  rows = global_batch // process_count
  lo = process_index * rows
  local = examples.batch(global_batch).map(no_autograph(lambda b: {k: v[lo:lo + rows] for k, v in b.items()}))
  batches = to_numpy(local.map(no_autograph(ds.options.preprocess.finish)), ds.options.prefetch)
  return _Named(batches, lambda: _bad(ds.builder, split, split), split)
