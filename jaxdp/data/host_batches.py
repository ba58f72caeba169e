"""Host batches built by plain numpy in the caller's thread, for splits with nothing to decode (`applies`).

A cached split (`cache.DecodedSource`), a token file, in-memory arrays or an `.npz` already reads final arrays: the
tf.data round trip of the streams (a `numpy_function` read, maps, prefetch) cost more than the read itself
(docs/design-notes.md#input-pipeline-choices). Here each batch is `source.read(ids)` then `Preprocess.train` / `finish`,
bitwise the same as the tf.data path's (tests/test_host_input.py), built when the caller asks for it: no thread
of its own, so its iterator may be pulled from any one thread (the device prefetch overlaps it with the step).

A read that fails surfaces as tf.data surfaces it: an `UnreadableExample` as itself, for the bad-example guard;
any other error as a `tf.errors.OpError` holding its Python traceback, so that the CLI reports it in one line
(`jaxdp.runtime.exits.input_failure`) and the guard re-reads the step, exactly as for the tf.data path.
"""

from __future__ import annotations

import itertools
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from jaxdp.data import tf_setup
from jaxdp.data.bad_examples import is_failure
from jaxdp.data.dataset import Batch, Dataset

if TYPE_CHECKING:  # Annotations only: TensorFlow is imported where it is used.
  import tensorflow as tf


def applies(ds: Dataset) -> bool:
  """Whether the batches of `ds` are built here: its source reads final arrays and no example is cropped alone."""
  return ds.corpus.decode is None and not ds.options.preprocess.image_size


def batches(make: Callable[[int], Batch], first: int, stop: int | None) -> Iterator[Batch]:
  """make(step) for steps first, first + 1, ..., stop - 1 (None: forever), each made when it is asked for."""
  for step in itertools.count(first) if stop is None else range(first, stop):
    try:
      batch = make(step)
    except Exception as e:
      if is_failure(e):  # Already what the guard repairs.
        raise
      raise _as_op_error(e) from e  # The source's own failure: reported as a failed tf.data worker (module doc).
    yield batch


def _as_op_error(error: Exception) -> tf.errors.OpError:
  """`error` as tf.data's `numpy_function` reports a Python exception: its type, message and traceback."""
  tf = tf_setup.tensorflow()  # Loaded here only when a source failed.
  text = "".join(traceback.format_exception(error))
  return tf.errors.UnknownError(None, None, f"{type(error).__name__}: {error}\n{text}")
