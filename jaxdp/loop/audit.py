"""The data-order audit's recorder (`config.audit_data`): each process appends its example ids of every step to
WORKDIR/audit/SEGMENT.pINDEX.ids (int64: the step, then the ids; a JSON header beside it), process 0 each checkpointed
step to SEGMENT.saves, a segment per run of the loop; `python -m jaxdp.audit` checks them (docs/faults.md)."""

import collections
import hashlib
import json
import os
import time
from typing import Any

import numpy as np

AUDIT_DIR = "audit"
IDS_DTYPE = "<i8"  # Each record of a .ids file: the step, then the process's ids, in this dtype.
HEADER_VERSION = 2


def batch_digest(ids: np.ndarray) -> str:
  """A short hash of a global batch's example ids, in row order (the `data/digest` metric)."""
  return hashlib.sha256(np.ascontiguousarray(ids, dtype=IDS_DTYPE).tobytes()).hexdigest()[:16]


def stem(directory: str, segment: str, process_index: int) -> str:
  """WORKDIR/audit/SEGMENT.pINDEX: the path of one process's records of a segment, without the suffix."""
  return os.path.join(directory, f"{segment}.p{process_index:05d}")


def saves_path(directory: str, segment: str) -> str:
  """The file of a segment's checkpointed steps (written by process 0)."""
  return os.path.join(directory, f"{segment}.saves")


class Recorder:
  """Per process: appends the example ids this process read for each trained step; gives each step's digest."""

  def __init__(self, header: dict[str, Any], directory: str | None, global_order: Any = None,
               read: collections.deque | None = None):
    self.header, self.global_order = header, global_order
    # Ids of batches read, not yet trained: appended by the prefetch thread, taken by `record` in the loop's;
    # a deque's append and popleft are atomic, and a batch's ids are in before the batch reaches the loop.
    self._read: collections.deque[np.ndarray] = collections.deque() if read is None else read
    self._ids = self._saves = None
    if directory is not None:  # Recording; otherwise only digests.
      os.makedirs(directory, exist_ok=True)
      path = stem(directory, header["segment"], header["process_index"])
      with open(path + ".json", "w") as f:
        json.dump(header, f)
      self._ids = open(path + ".ids", "ab")
      if header["process_index"] == 0:
        self._saves = open(saves_path(directory, header["segment"]), "a")

  def record(self, step: int) -> None:
    """Appends `step` and the ids read for it, the oldest batch taken (flushed: a killed run keeps them)."""
    if self._ids is not None:
      if not self._read:
        raise RuntimeError(f"step {step}: no example ids were read for it (read the batches with on_ids)")
      self._ids.write(np.concatenate([[step], self._read.popleft()]).astype(IDS_DTYPE).tobytes())
      self._ids.flush()

  def saved(self, step: int) -> None:
    """Notes that the state after `step` was checkpointed (process 0)."""
    if self._saves is not None:
      self._saves.write(f"{step}\n")
      self._saves.flush()

  def ids(self, step: int) -> np.ndarray | None:
    """The example ids of global batch `step` (positions in the split, in row order); None when no order was given."""
    if self.global_order is None:
      return None
    return self.global_order.rows(step - 1, 0, self.header["global_batch"])

  def digest(self, step: int) -> str | None:
    """The digest of global batch `step`; None when no order was given."""
    ids = self.ids(step)
    return None if ids is None else batch_digest(ids)

  def metrics(self, step: int) -> dict[str, str]:
    """{"data/digest": ...} for a logged step's metrics (empty when the digest is unknown)."""
    digest = self.digest(step)
    return {} if digest is None else {"data/digest": digest}

  def close(self) -> None:
    for f in (self._ids, self._saves):
      if f is not None:
        f.close()
    self._ids = self._saves = None


def start(workdir: str, config: Any, ds: Any, global_batch: int, start_step: int, restored_from: int | None,
          process_index: int, process_count: int, num_devices: int, read: collections.deque | None = None) -> Recorder:
  """The recorder of the segment that starts at `start_step` (recording if `config.audit_data`), taking ids from `read`."""
  from jaxdp.data import stream  # The input pipeline's own order of examples.
  split = config.dataset.train_split
  n = ds.num_examples(split)
  rows = global_batch // process_count
  order = stream.train_order(ds, split, config.seed, global_batch)
  header = {"version": HEADER_VERSION, "segment": _segment_id(process_count), "process_index": process_index,
            "process_count": process_count, "num_devices": num_devices, "global_batch": global_batch,
            "rows": [process_index * rows, (process_index + 1) * rows], "num_examples": n,
            "steps_per_epoch": order.steps_per_epoch,
            "seed": config.seed, "split": split, "dataset": ds.name, "start_step": start_step,
            "restored_from": restored_from, "order": stream.GLOBAL}
  directory = os.path.join(workdir, AUDIT_DIR) if config.audit_data else None
  return Recorder(header, directory, order, read)


def _segment_id(process_count: int) -> str:
  """Process 0's clock in ns, shared by every process: sorts segments in order of their start."""
  now = time.time_ns()
  if process_count > 1:
    from jax.experimental import multihost_utils
    parts = np.array([now // 2**31, now % 2**31], np.int32)  # int32: JAX without x64 would truncate int64.
    hi, lo = (int(x) for x in multihost_utils.broadcast_one_to_all(parts))
    now = hi * 2**31 + lo
  return f"{now:020d}"
