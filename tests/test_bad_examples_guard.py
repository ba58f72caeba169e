"""The bad-example guard (`jaxdp.data.bad_examples.Guarded`) on a split of numbers: which rows it names or replaces,
and how many it counts. The real decoders and streams are in test_bad_images and test_bad_examples_data."""

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from jaxdp.data import bad_examples
from jaxdp.data.source import UnreadableExample

SIZE = 10  # Examples 0..9 of split "train"; an example's value is its index.


def _guard(bad: set[int], rows_of: Callable[[int], list[int]], skip: bool = True) -> bad_examples.Guarded:
  """A guard over a split where the examples in `bad` do not decode; step s reads the examples `rows_of(s)`."""

  def open_from(step: int, swaps: bad_examples.Swaps) -> Iterator[dict]:
    while True:
      ids = bad_examples.swapped(np.array(rows_of(step)), swaps.get(step))
      if unreadable := [int(i) for i in ids if int(i) in bad]:
        raise UnreadableExample(f"example {unreadable[0]} is truncated")
      yield {"x": ids}
      step += 1

  return bad_examples.Guarded(open_from, lambda step: np.array(rows_of(step)), lambda step, row, i: i not in bad,
                              split="train", size=SIZE, start=0, skip=skip)


def test_each_bad_row_is_replaced_by_the_next_example_that_decodes_wrapping_around():
  guard = _guard({4, 5, 9}, lambda step: [4, 9, 2, 3])
  assert next(guard)["x"].tolist() == [6, 0, 2, 3]  # 4 -> 5 is bad too -> 6; 9 -> 0, past the split's end.


def test_the_replaced_rows_are_counted_per_step_through_the_step_asked():
  steps = [[4, 9, 2], [1, 2, 3], [5, 0, 1]]
  guard = _guard({4, 5, 9}, lambda step: steps[step])
  assert [next(guard)["x"].tolist() for _ in steps] == [[6, 0, 2], [1, 2, 3], [6, 0, 1]]
  assert [guard.skipped_through(step) for step in range(3)] == [2, 2, 3]
  assert bad_examples.skipped_through(guard, 2) == 3 and bad_examples.skipped_through(iter([]), 2) == 0


def test_without_skipping_the_error_names_five_indices_and_counts_the_rest():
  guard = _guard(set(range(8)), lambda step: list(range(8)), skip=False)
  with pytest.raises(bad_examples.BadExampleError,
                     match=r"^cannot decode example 0, 1, 2, 3, 4 \(\+3 more\) of split 'train' \(example 0 is "
                           r"truncated\); fix or remove it, or set dataset.skip_bad_examples=True"):
    next(guard)


def test_a_split_where_nothing_decodes_is_a_config_error():
  guard = _guard(set(range(SIZE)), lambda step: [3])
  with pytest.raises(bad_examples.BadExampleError, match=r"no example of split 'train' decodes \(tried all 10\)"):
    next(guard)


def test_a_failure_with_no_bad_row_is_raised_as_it_is():
  """A step that fails although each of its examples decodes alone (a broken source) is not a bad example."""
  guard = bad_examples.Guarded(lambda step, swaps: _failing(), lambda step: np.array([1, 2]), lambda *a: True,
                               split="train", size=SIZE, start=0, skip=True)
  with pytest.raises(UnreadableExample, match="the disk is gone"):
    next(guard)


def _failing() -> Iterator[dict]:
  raise UnreadableExample("the disk is gone")
  yield {}  # A generator: it fails when read, as a stream does.
