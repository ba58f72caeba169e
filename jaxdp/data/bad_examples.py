"""Examples that do not decode: found one by one once a step fails, then named, or replaced and counted."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Union

import numpy as np

from jaxdp.config import ConfigError
from jaxdp.data.dataset import Batch
from jaxdp.data.source import UnreadableExample
from jaxdp.runtime import exits

if TYPE_CHECKING:  # Annotations only: TensorFlow is imported where it is used.
  import tensorflow as tf

log = logging.getLogger("jaxdp")

Failure = Union["tf.errors.OpError", UnreadableExample, "ReadError"]  # How a step whose examples do not all decode fails.
Swaps = Mapping[int, Mapping[int, int]]  # step -> {row of this process's rows: replacement index in the split}.
MAX_NAMED = 5  # Indices an error names; more are counted.


class BadExampleError(ConfigError):
  """An example of the data cannot be decoded: bad input, so a one-line error and exit status 2."""


class ReadError(exits.InputFailure):
  """A source's read on the host failed (its error is the cause); the guard re-reads the step as for a decode."""


def is_failure(error: BaseException) -> bool:
  """Whether `error` is a `Failure` (no TensorFlow `OpError` exists before TensorFlow is loaded)."""
  tf = sys.modules.get("tensorflow")
  return isinstance(error, (UnreadableExample, ReadError)) or tf is not None and isinstance(error, tf.errors.OpError)


def swapped(indices: np.ndarray, swaps: Mapping[int, int] | None) -> np.ndarray:
  """`indices` (this process's rows of one step) with the rows in `swaps` replaced."""
  if not swaps:  # Every step of a clean stream: no copy.
    return indices
  out = np.array(indices, copy=True)
  out[list(swaps)] = list(swaps.values())
  return out


class Guarded(Iterator[Batch]):
  """The batches of steps start, start + 1, ...; a step that fails to decode is named, or repaired and counted."""

  # open_from(step, swaps): the batches from `step` on, with `swaps`; indices(step): this process's rows' indices;
  # decodes(step, row, index): whether `index` decodes as that row.
  def __init__(self, open_from: Callable[[int, Swaps], Iterator[Batch]], indices: Callable[[int], np.ndarray],
               decodes: Callable[[int, int, int], bool], *, split: str, size: int, start: int, skip: bool):
    self._open_from, self._indices, self._decodes = open_from, indices, decodes
    self.split, self.size, self.skip = split, size, skip
    self._step = start
    self._batches = open_from(start, {})
    self.skipped: dict[int, int] = {}  # step -> bad examples replaced in this process's rows of it.

  def __next__(self) -> Batch:
    try:
      batch = next(self._batches)
    except Exception as e:
      if not is_failure(e):
        raise
      batch = self._repair(self._step, e)
    self._step += 1
    return batch

  def skipped_through(self, step: int) -> int:
    """Bad examples replaced in this process's rows of the steps up to `step` (reading runs ahead)."""
    return sum(n for s, n in self.skipped.copy().items() if s <= step)  # A copy: the prefetch thread may add a step.

  def _repair(self, step: int, error: Failure) -> Batch:
    """The failed step read again with its bad rows replaced; raises BadExampleError when not skipping."""
    try:
      bad = [(row, int(i)) for row, i in enumerate(self._indices(step)) if not self._decodes(step, row, int(i))]
    except Exception:  # The read itself fails, not a decode (a broken source): the stream's error says so.
      bad = []
    if not bad:
      raise error  # Not an example that fails to decode: some other failure, reported as it is.
    if not self.skip:
      raise named_error(self.split, [index for _, index in bad], error)
    swaps = {row: self._replacement(step, row, index) for row, index in bad}
    log.warning("%s step %d: replaced %d bad example(s) (dataset.skip_bad_examples): %s", self.split, step,
                len(bad), ", ".join(f"{index} -> {swaps[row]}" for row, index in bad))
    self.skipped[step] = len(bad)
    self._batches = self._open_from(step, {step: swaps})
    return next(self._batches)

  def _replacement(self, step: int, row: int, index: int) -> int:
    """The next index after `index` (wrapping around) whose example decodes at this position."""
    # A function of the step, row and data only: any run, resumed or on any process count, reads the same examples.
    for k in range(1, self.size):
      candidate = (index + k) % self.size
      if self._decodes(step, row, candidate):
        return candidate
    raise BadExampleError(f"no example of split {self.split!r} decodes (tried all {self.size})")


def named_error(split: str, indices: list[int], error: Failure) -> BadExampleError:
  """One line naming the split, the bad indices, and TensorFlow's reason."""
  more = f" (+{len(indices) - MAX_NAMED} more)" if len(indices) > MAX_NAMED else ""
  return BadExampleError(f"cannot decode example {', '.join(map(str, indices[:MAX_NAMED]))}{more} of split {split!r} "
                         f"({reason_of(error)}); fix or remove it, or set dataset.skip_bad_examples=True to replace "
                         "bad examples and train on")


def reason_of(error: Failure) -> str:
  """The cause `error` names: TensorFlow's first line without what it puts around it, or the message."""
  message = error.message if hasattr(error, "message") else str(error)
  return exits.tf_cause(message or "") or type(error).__name__


def skipped_through(stream: Iterator[Batch], step: int) -> int:
  """Bad examples a stream replaced up to `step` (0 for a stream that is not `Guarded`)."""
  return stream.skipped_through(step) if isinstance(stream, Guarded) else 0
