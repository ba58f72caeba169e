"""User datasets whose reads fail, for the tests that a failure inside an input worker ends the process."""

import numpy as np
import tensorflow_datasets as tfds

from user_datasets import TinyBlobs

BAD_INDEX = 50  # A train example in the first epoch of any order (96 examples, batches of 32).


class _FailingRecords:
  """A data source that raises when a read includes BAD_INDEX (as a broken file or reader would)."""

  def __init__(self, records, error: type[Exception]):
    self._records, self._error = records, error

  def __len__(self) -> int:
    return len(self._records)

  def __getitem__(self, i: int):
    return self.__getitems__([i])[0]

  def __getitems__(self, keys: list[int]) -> list:
    if BAD_INDEX in keys:
      raise self._error(f"cannot read example {BAD_INDEX}")
    return self._records.__getitems__(keys)


class FailingReadBlobs(TinyBlobs):
  """TinyBlobs whose train split raises a ValueError inside the tf.data worker that reads example 50."""
  error: type[Exception] = ValueError

  def as_data_source(self, split, **kwargs):  # noqa: ANN001, ANN201  (tfds' signature)
    records = super().as_data_source(split, **kwargs)
    return _FailingRecords(records, self.error) if split == "train" else records
