"""The train and eval streams (this process's rows of each global batch, read by index) and the resume contract."""

import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from jaxdp.batch import INDEX, REAL
from jaxdp.config import ConfigError
from jaxdp.data import bad_examples, order, preprocess, reader
from jaxdp.data.bad_examples import ReadError, Swaps
from jaxdp.data.dataset import Batch, Dataset

_FOREVER = 2**62  # "Forever": the stream of steps is cut by the number of steps.
VERSION = 2  # Of the order of examples and of their augmentation draws: bump it whenever either changes.
GLOBAL = "global"  # The spec's `order`: one global order, read by index.


def on_host(ds: Dataset) -> bool:
  """Whether the batches of `ds` are made by numpy on the host: its source reads final arrays, nothing is cropped."""
  return ds.corpus.decode is None and not ds.options.preprocess.image_size


def train_order(ds: Dataset, split: str, seed: int, global_batch: int) -> order.GlobalOrder:
  """The one global order of the train stream's examples."""
  return order.GlobalOrder(ds.num_examples(split), global_batch, seed, split)


def train_batches(ds: Dataset, split: str, *, seed: int, global_batch: int, start_step: int, process_index: int,
                  process_count: int, stop_step: int | None = None, with_ids: bool = False,
                  _tf_data: bool = False) -> Iterator[Batch]:
  """This process's rows of global batches start_step, ..., stop_step - 1 (None: forever, which can hold the exit:
  docs/design-notes.md#input-pipeline-choices); `with_ids` adds `INDEX`; `_tf_data`: through tf.data always."""
  # A pure function of the step: the position to checkpoint is the train state's step (reading runs ahead).
  rows = global_batch // process_count
  first_row = process_index * rows
  source, pre = ds.source(split), ds.options.preprocess
  the_order = train_order(ds, split, seed, global_batch)

  def ids(step: int) -> np.ndarray:
    return the_order.rows(step, first_row, first_row + rows)

  ids(start_step)  # The first epoch's order now, in the caller's thread, not first in the one that reads ahead.

  def rows_of(indices: np.ndarray) -> Batch:
    return {**source.read(indices), INDEX: np.array(indices)} if with_ids else source.read(indices)

  def crop(example: dict) -> dict:
    key = preprocess.example_seed(seed, example["step"], example["row"])
    return {**example, "inputs": preprocess.train_crop(example["inputs"], key, pre.image_size, ds.input_shape[-1],
                                                       pre.flip)}

  return _guarded(ds, split, ids, rows_of, lambda step, swaps: rows_of(bad_examples.swapped(ids(step), swaps.get(step))),
                  lambda batch, step: pre.train(batch, step, seed=seed, global_batch=global_batch, first_row=first_row),
                  crop if pre.image_size else None, rows, first_row, start_step, stop_step, _tf_data)


def eval_batches(ds: Dataset, split: str, *, global_batch: int, process_index: int, process_count: int,
                 _tf_data: bool = False) -> Iterator[Batch]:
  """Every example of `split` exactly once, padded to full batches; `REAL` marks the real ones."""
  source, pre = ds.source(split), ds.options.preprocess
  n, rows = len(source), global_batch // process_count
  lo = process_index * rows

  def read(step: int, swaps: Swaps) -> Batch:
    # Padding repeats real examples from the start (so they decode like any other) with REAL False; so does a bad
    # example's replacement: an eval counts every good example once and a bad one never.
    indices, mask = order.eval_rows(n, global_batch, step, lo, lo + rows)
    replaced = swaps.get(step, {})
    mask[list(replaced)] = False
    return {**source.read(bad_examples.swapped(indices, replaced)), REAL: mask}

  def crop(example: dict) -> dict:
    return {**example, "inputs": preprocess.eval_crop(example["inputs"], pre.image_size, ds.input_shape[-1])}

  return _guarded(ds, split, lambda step: order.eval_rows(n, global_batch, step, lo, lo + rows)[0],
                  lambda indices: {**source.read(indices), REAL: np.ones(len(indices), bool)}, read,
                  lambda batch, step: pre.finish(batch), crop if pre.image_size else None, rows, lo, 0,
                  math.ceil(n / global_batch), _tf_data)


def _guarded(ds: Dataset, split: str, ids: Callable[[int], np.ndarray], rows_of: Callable[[np.ndarray], Batch],
             read: Callable[[int, Swaps], Batch], finish: Callable[[Batch, int], Batch],
             per_example: Callable[[dict], dict] | None, rows: int, first_row: int, start: int, stop: int | None,
             tf_data: bool) -> Iterator[Batch]:
  """The steps' batches (`read` then `finish`), on the host or through tf.data (bitwise the same), guarded."""
  decode, n = ds.corpus.decode, ds.num_examples(split)

  def open_on_host(first: int, swaps: Swaps) -> Iterator[Batch]:
    for step in itertools.count(first) if stop is None else range(first, stop):
      try:
        batch = finish(read(step, swaps), step)
      except Exception as e:
        if bad_examples.is_failure(e):  # Already what the guard repairs.
          raise
        raise ReadError(f"reading the batch of step {step} failed: {type(e).__name__}: {e}") from e
      yield batch

  def open_tf_data(first: int, swaps: Swaps) -> Iterator[Batch]:
    steps = reader.tensorflow().data.Dataset.range(first, _FOREVER if stop is None else stop)
    batches = reader.read_steps(decode, reader.probe_row(rows_of, n), steps, lambda step: read(int(step), swaps),
                                rows, first_row, per_example)
    return (finish(b, int(b.pop("step")[0])) for b in reader.to_numpy(batches))

  check = reader.example_check(decode, per_example)

  def decodes(step: int, row: int, index: int) -> bool:
    return check(lambda: rows_of(np.array([index], np.int64)), step, first_row + row)

  return bad_examples.Guarded(open_on_host if on_host(ds) and not tf_data else open_tf_data, ids, decodes,
                              split=split, size=n, start=start, skip=ds.options.skip_bad_examples)


def num_eval_steps(ds: Dataset, split: str, global_batch: int) -> int:
  """Global eval batches that cover `split` once."""
  return math.ceil(ds.num_examples(split) / global_batch)


def stream_spec(ds: Dataset, split: str, *, seed: int, global_batch: int) -> dict[str, Any]:
  """What the train batches depend on besides the step (never the process count), saved with every checkpoint."""
  pre = ds.options.preprocess
  spec = {"version": VERSION, "dataset": ds.corpus.facts.name, "source": ds.kind, "order": GLOBAL, "split": split,
          "seed": seed, "global_batch": global_batch, "features": sorted(ds.element_spec()),
          "crop_padding": pre.crop_padding, "flip": pre.flip, "image_size": pre.image_size}
  if pre.image_size:
    spec["crop"] = preprocess.RECIPE
  return spec


def check_resume(saved: dict[str, Any], current: dict[str, Any]) -> None:
  """Raises unless resuming at the saved step continues the saved stream exactly (no replay, no skip)."""
  if saved.get("version") != current.get("version"):
    raise ConfigError(f"the checkpoint's input stream is of jaxdp's order version {saved.get('version', 1)}, this "
                      f"jaxdp reads version {current.get('version')}: it cannot continue that stream; start in a new "
                      f"workdir")
  changed = [f"{k} {saved.get(k)!r} -> {current.get(k)!r}" for k in sorted({*saved, *current})
             if saved.get(k) != current.get(k)]
  if changed:
    raise ConfigError(f"the checkpoint's input stream differs ({'; '.join(changed)}): resuming would replay or skip "
                      f"examples; restore those values or start in a new workdir")
