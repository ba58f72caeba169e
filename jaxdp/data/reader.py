"""step -> this process's rows of that batch, read by index and decoded in parallel tf.data workers (in order);
shared by the train and eval streams, as is the last hop: prefetch, then numpy."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow_datasets as tfds

from jaxdp.batch import INDEX, REAL  # noqa: F401  (re-exported: the stream modules import them from here)
from jaxdp.data import tf_setup
from jaxdp.data.dataset import Batch, Dataset
from jaxdp.data.source import UnreadableExample, tf_read

if TYPE_CHECKING:  # Annotations only: TensorFlow is imported where it is used.
  import tensorflow as tf

# Batches tf.data decodes ahead: enough to keep its workers busy while parallel.prefetch's thread, the one setting
# of how far input runs ahead, takes a batch.
PREFETCH = 2


def read_steps(ds: Dataset, probe: dict[str, np.ndarray], steps: tf.data.Dataset,
               read: Callable[[np.ndarray], dict], rows: int, first_row: int,
               per_example: Callable[[dict], dict] | None) -> tf.data.Dataset:
  """step -> this process's `rows` examples, read by index, decoded (and `per_example`'d) in parallel workers.

  `probe`: one row as `read` returns it (its keys, dtypes and shapes). Each element carries "step" and
  "row" (its row in the global batch) for keyed augmentation.
  """
  tf = tf_setup.tensorflow()
  read_tf = tf_read(probe, read)

  def read_step(step: tf.Tensor) -> dict:
    example = {k: tf.ensure_shape(a, [rows, *probe[k].shape[1:]]) for k, a in read_tf(step).items()}
    return {**example, "step": tf.fill([rows], step), "row": first_row + tf.range(rows, dtype=tf.int64)}

  decode = _decoder(ds, per_example)
  batches = steps.map(no_autograph(read_step), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  if ds.corpus.decode is None and per_example is None:
    return batches.map(no_autograph(decode))
  if per_example is None:  # Fixed shapes: decode each step's rows at once.
    return decode_rows(batches, decode, decoded_spec(probe, decode))
  examples = batches.unbatch().map(no_autograph(decode), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return examples.batch(rows, drop_remainder=True)


def _decoder(ds: Dataset, per_example: Callable[[dict], dict] | None) -> Callable[[dict], dict]:
  """One read example (with its "step" and "row") -> its features, decoded (and `per_example`'d)."""
  def decode(example: dict) -> dict:
    if ds.corpus.decode is None:  # Read as final arrays: every key the source returns is a feature.
      out = dict(example)
    else:
      out = {**ds.corpus.decode(example), **{k: example[k] for k in ("step", "row", REAL, INDEX) if k in example}}
    return per_example(out) if per_example is not None else out

  return decode


def probe_row(read: Callable[[np.ndarray], dict[str, np.ndarray]], n: int) -> dict[str, np.ndarray]:
  """One row as `read` (indices -> rows) returns it, for its keys, dtypes and shapes: the first one it can read."""
  for index in range(max(n, 1)):
    try:
      return read(np.array([index], np.int64))
    except UnreadableExample:  # A bad example of a split decoded in memory: any other row has the same type.
      if index == n - 1:
        raise
  raise AssertionError("unreachable")


def example_check(ds: Dataset, per_example: Callable[[dict], dict] | None
                  ) -> Callable[[Callable[[], dict[str, np.ndarray]], int, int], bool]:
  """check(read, step, row): whether one example (`read()`: its row as the source returns it) decodes as row
  `row` of step `step`.

  Decoded alone, as the stream decodes it: used only after a step failed, to find which row failed. The decode
  is traced once per stream, not once per example (a replacement may try many). A source that knows the example
  does not decode says so (`UnreadableExample`: a split decoded in memory).
  """
  @functools.cache
  def traced() -> Callable[[dict], dict]:  # At the first check: a stream that never fails never loads TensorFlow.
    tf = tf_setup.tensorflow()
    return tf.function(_decoder(ds, per_example), autograph=False, reduce_retracing=True)

  def check(read: Callable[[], dict[str, np.ndarray]], step: int, row: int) -> bool:
    try:
      one_row = read()
    except UnreadableExample:
      return False
    tf = tf_setup.tensorflow()
    example = {**{k: v[0] for k, v in one_row.items()}, "step": np.int64(step), "row": np.int64(row)}
    try:  # As tensors: numpy scalars (the encoded bytes, the step) would be traced in as constants, one trace each.
      traced()({k: tf.constant(v) for k, v in example.items()})
    except tf.errors.OpError:
      return False
    return True

  return check


def decode_rows(batches: tf.data.Dataset, decode: Callable[[dict], dict],
                spec: dict[str, tf.TensorSpec]) -> tf.data.Dataset:
  """Each element's rows (of fixed decoded shapes `spec`) decoded by one map_fn, elements in parallel, in order:
  faster than a tf.data map per row (docs/design-notes.md#input-pipeline-choices)."""
  tf = tf_setup.tensorflow()
  return batches.map(no_autograph(lambda b: tf.map_fn(decode, b, fn_output_signature=spec)),
                     num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def decoded_spec(probe: dict[str, np.ndarray], decode: Callable[[dict], dict],
                 position: bool = True) -> dict[str, tf.TensorSpec]:
  """The type of one decoded row, found by tracing `decode` on the probe's row (with its "step" and "row" when
  `position`: the stream's decoder takes them)."""
  tf = tf_setup.tensorflow()
  one = {k: tf.constant(v[0], tf.string if v.dtype == object else None) for k, v in probe.items()}
  if position:
    one.update(step=tf.constant(0, tf.int64), row=tf.constant(0, tf.int64))
  outputs = tf.function(decode).get_concrete_function(one).structured_outputs
  return {k: tf.TensorSpec(v.shape, v.dtype) for k, v in outputs.items()}


def drop_row(batch: Batch, *keys: str) -> Batch:
  """A decoded batch without the positions `read_steps` gave its rows for keyed crops ("row", and `keys`)."""
  for key in ("row", *keys):
    del batch[key]
  return batch


def to_numpy(batches: tf.data.Dataset) -> Iterator[Batch]:
  """The batches as numpy, PREFETCH deep."""
  return iter(tfds.as_numpy(prefetched(batches)))


def prefetched(batches: tf.data.Dataset) -> tf.data.Dataset:
  """`batches`, PREFETCH deep, not autotuned."""
  tf = tf_setup.tensorflow()
  # Not tf.data.AUTOTUNE: deleting an autotuned iterator at a stream's end waits seconds for tf.data's autotuning
  # thread, and decoding is as fast with the fixed parallelism (docs/design-notes.md#input-pipeline-choices).
  options = tf.data.Options()
  options.autotune.enabled = False
  return batches.prefetch(PREFETCH).with_options(options)


def no_autograph(fn: Callable[..., Any]) -> Callable[..., Any]:
  """`fn` traced as written: it has no Python control flow on tensors, so autograph would only cost time."""
  tf = tf_setup.tensorflow()
  return tf.autograph.experimental.do_not_convert(fn)
