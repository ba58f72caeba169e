"""TensorFlow as jaxdp loads it (`tensorflow()`: at first use, never on an accelerator), and tf.data's reads."""

from __future__ import annotations

import functools
import logging
import os
import sys
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow_datasets as tfds

from jaxdp.batch import INDEX, REAL
from jaxdp.data.source import Rows, UnreadableExample
from jaxdp.runtime import quiet

if TYPE_CHECKING:  # Annotations only: TensorFlow is imported where it is used.
  import tensorflow as tf

PREFETCH = 2  # Batches tf.data decodes ahead, to keep its workers busy (feed.Feeder sets how far input runs ahead).
Decode = Callable[[dict], dict]


@functools.cache
def tensorflow() -> types.ModuleType:
  """TensorFlow with no GPU or TPU visible to it and its Python log at ERROR, imported (once) if not loaded yet."""
  if "tensorflow" not in sys.modules:
    for name, value in quiet.TF_ENV.items():  # A value already set wins (JAX's import sets the log level).
      os.environ.setdefault(name, value)
  import tensorflow as tf  # The one import of TensorFlow in jaxdp.
  try:
    for kind in ("GPU", "TPU"):
      tf.config.set_visible_devices([], kind)
  except RuntimeError:  # The user's own TensorFlow ran ops before jaxdp's first use: its devices are fixed.
    logging.getLogger("jaxdp").warning("TensorFlow set its devices before jaxdp's input pipeline used it, and may "
                                       "hold accelerator memory: call tf.config.set_visible_devices([], 'GPU') "
                                       "before TensorFlow's first op")
  tf.get_logger().setLevel(logging.ERROR)
  return tf


def tf_read(probe: Rows, read: Callable[[np.ndarray], Rows]) -> Callable[[tf.Tensor], dict[str, tf.Tensor]]:
  """`read` (indices -> rows) as a TF function typed after `probe`; an `UnreadableExample` fails as a TF op."""
  tf = tensorflow()
  keys = sorted(probe)
  dtypes = [tf.string if probe[k].dtype == object else tf.as_dtype(probe[k].dtype) for k in keys]

  def read_once(a: np.ndarray) -> list[np.ndarray]:
    try:
      rows, why = read(a), ""  # One read per call, whatever the number of features.
    except UnreadableExample as e:
      rows, why = probe, str(e)  # Typed as the outputs; the assertion below fails before anything reads them.
    return [rows[k] for k in keys] + [np.array(why.encode(), object)]

  def call(x: tf.Tensor) -> dict[str, tf.Tensor]:
    *arrays, why = tf.numpy_function(read_once, [x], [*dtypes, tf.string], stateful=False)
    with tf.control_dependencies([tf.debugging.Assert(tf.equal(why, ""), [why])]):
      return {k: tf.identity(a) for k, a in zip(keys, arrays)}

  return call


def read_steps(decode: Decode | None, probe: Rows, steps: tf.data.Dataset, read: Callable[[np.ndarray], dict],
               rows: int, first_row: int, per_example: Decode | None) -> tf.data.Dataset:
  """step -> this process's `rows` examples, read by index, decoded (and `per_example`'d), with their "step"."""
  tf = tensorflow()
  read_tf = tf_read(probe, read)

  def read_step(step: tf.Tensor) -> dict:
    example = {k: tf.ensure_shape(a, [rows, *probe[k].shape[1:]]) for k, a in read_tf(step).items()}
    return {**example, "step": tf.fill([rows], step), "row": first_row + tf.range(rows, dtype=tf.int64)}

  one = _decoder(decode, per_example)
  batches = steps.map(no_autograph(read_step), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  if decode is None and per_example is None:
    return batches.map(no_autograph(one))
  if per_example is None:  # Fixed shapes: decode each step's rows at once.
    return decode_rows(batches, one, decoded_spec(probe, one))
  examples = batches.unbatch().map(no_autograph(one), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return examples.batch(rows, drop_remainder=True)


def _decoder(decode: Decode | None, per_example: Decode | None) -> Decode:
  """One read example (with its "step" and "row") -> its features, decoded (and `per_example`'d), and its "step"."""
  def one(example: dict) -> dict:
    if decode is None:  # Read as final arrays: every key the source returns is a feature.
      out = dict(example)
    else:
      out = {**decode(example), **{k: example[k] for k in ("step", "row", REAL, INDEX) if k in example}}
    out = per_example(out) if per_example is not None else out
    return {k: v for k, v in out.items() if k != "row"}  # Only for keyed crops.

  return one


def probe_row(read: Callable[[np.ndarray], Rows], n: int) -> Rows:
  """The first row `read` (indices -> rows) can read, for its keys, dtypes and shapes."""
  for index in range(n - 1):
    try:
      return read(np.array([index], np.int64))
    except UnreadableExample:  # A bad example of a split decoded in memory: any other row has the same type.
      pass
  return read(np.array([max(n - 1, 0)], np.int64))


def example_check(decode: Decode | None, per_example: Decode | None) -> Callable[[Callable[[], Rows], int, int], bool]:
  """check(read, step, row): whether one example (`read()`: its row) decodes alone as row `row` of step `step`."""
  @functools.cache
  def traced() -> Decode:  # At the first check: a stream that never fails never loads TensorFlow.
    return tensorflow().function(_decoder(decode, per_example), autograph=False, reduce_retracing=True)

  def check(read: Callable[[], Rows], step: int, row: int) -> bool:
    try:
      one_row = read()
    except UnreadableExample:
      return False
    tf = tensorflow()
    example = {**{k: v[0] for k, v in one_row.items()}, "step": np.int64(step), "row": np.int64(row)}
    try:  # As tensors: numpy scalars (the encoded bytes, the step) would be traced in as constants, one trace each.
      traced()({k: tf.constant(v) for k, v in example.items()})
    except tf.errors.OpError:
      return False
    return True

  return check


def decode_rows(batches: tf.data.Dataset, decode: Decode, spec: dict[str, tf.TensorSpec]) -> tf.data.Dataset:
  """Each element's rows decoded (to `spec`) by one map_fn, elements in parallel, in order: faster than per row."""
  tf = tensorflow()
  return batches.map(no_autograph(lambda b: tf.map_fn(decode, b, fn_output_signature=spec)),
                     num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def decoded_spec(probe: Rows, decode: Decode, position: bool = True) -> dict[str, tf.TensorSpec]:
  """The type of one decoded row, traced on the probe's row (with "step" and "row" when `position`)."""
  tf = tensorflow()
  one = {k: tf.constant(v[0], tf.string if v.dtype == object else None) for k, v in probe.items()}
  if position:
    one.update(step=tf.constant(0, tf.int64), row=tf.constant(0, tf.int64))
  outputs = tf.function(decode).get_concrete_function(one).structured_outputs
  return {k: tf.TensorSpec(v.shape, v.dtype) for k, v in outputs.items()}


def to_numpy(batches: tf.data.Dataset) -> Iterator[Rows]:
  """The batches as numpy, PREFETCH deep."""
  return iter(tfds.as_numpy(prefetched(batches)))


def prefetched(batches: tf.data.Dataset) -> tf.data.Dataset:
  """`batches`, PREFETCH deep, not autotuned."""
  tf = tensorflow()
  # Deleting an autotuned iterator waits for its thread: docs/design-notes.md#input-pipeline-choices.
  options = tf.data.Options()
  options.autotune.enabled = False
  return batches.prefetch(PREFETCH).with_options(options)


def no_autograph(fn: Callable[..., Any]) -> Callable[..., Any]:
  """`fn` traced as written: it has no Python control flow on tensors, so autograph would only cost time."""
  return tensorflow().autograph.experimental.do_not_convert(fn)
