"""A train split held whole, as its batches hold it, so that the devices gather each step's rows themselves.

A split with nothing to decode whose source holds it as arrays (`source.held()`: in-memory arrays, a split cached
decoded) and whose batches are not augmented is the same rows whether the host gathers them and finishes them
(`Preprocess.finish`: casts, the normalization, all per element) or finishes the whole split once and a
step gathers its rows from that: bitwise the same batches. `jaxdp.resident` places it on the devices; the train
stream then yields only each step's row ids (`train_batches(row_ids=True)`).
"""

from jaxdp.data import host_batches
from jaxdp.data.dataset import Batch, Dataset


def nbytes(ds: Dataset, split: str) -> int | None:
  """Bytes the split takes as batches hold it; None when it cannot be held (see the module doc)."""
  pre = ds.options.preprocess
  if not host_batches.applies(ds) or pre.augments:
    return None
  if getattr(ds.source(split), "held", None) is None:
    return None
  return ds.row_bytes() * ds.num_examples(split)


def holds(ds: Dataset, name: str) -> bool:
  """Whether split `name` of `ds` can be held (see the module doc; no unreadable example); copies nothing."""
  return nbytes(ds, name) is not None and ds.source(name).held() is not None


def split(ds: Dataset, name: str) -> Batch:
  """Split `name` of `ds` whole, finished as its batches are (a copy when finishing casts or normalizes); for a
  split that `holds`."""
  return ds.options.preprocess.finish(dict(ds.source(name).held()))
