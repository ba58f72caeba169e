"""Host batches built by plain numpy in the caller's thread, for splits with nothing to decode (`applies`).

A cached split, a token file, in-memory arrays or an `.npz` already reads final arrays: each batch is
`source.read(ids)` then `Preprocess.train` / `finish`, bitwise the tf.data path's (tests/test_host_input.py), made when
asked for (docs/design-notes.md#input-pipeline-choices). A read that fails raises `UnreadableExample` as itself, for
the bad-example guard, and any other error as a `ReadError` naming the step, caused by the source's own error.
"""

import itertools
from collections.abc import Callable, Iterator

from jaxdp.data.bad_examples import ReadError, is_failure
from jaxdp.data.dataset import Batch, Dataset


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
      raise ReadError(f"reading the batch of step {step} failed: {type(e).__name__}: {e}") from e
    yield batch
