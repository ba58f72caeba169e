"""The stateless global order: which examples global batch `step` holds, as a pure function of (seed, step).

Global batch `step` is positions [k * B, (k + 1) * B) of epoch e's permutation, where
e, k = divmod(step, steps_per_epoch) and the permutation is `tf.random.experimental.stateless_shuffle`
seeded by (seed, epoch); the last n % B examples of each epoch sit it out. Process p of P reads rows
[p * B / P, (p + 1) * B / P) of each global batch. Only the permutations of the epochs in use are held
(n int64 each), never the examples. `ShardOrder` is the opt-in `dataset.shard_by_process` order.
"""

import threading

import numpy as np
import tensorflow as tf

from jaxdp.config import ConfigError
from jaxdp.data.preprocess import SHUFFLE, seed_for


def steps_per_epoch(n: int, batch: int, split: str) -> int:
  """Whole global batches in one epoch of `n` examples."""
  if n < batch:
    raise ConfigError(f"batch ({batch}) exceeds the {n} examples of split {split!r}")
  return n // batch


class GlobalOrder:
  """Example indices of every global batch of the train stream; thread-safe."""

  def __init__(self, n: int, global_batch: int, seed: int, split: str):
    self.n, self.global_batch, self.seed = n, global_batch, seed
    self.steps_per_epoch = steps_per_epoch(n, global_batch, split)
    self._epochs: dict[int, np.ndarray] = {}  # The two most recent epochs' permutations (prefetch crosses epochs).
    self._lock = threading.Lock()

  def permutation(self, epoch: int) -> np.ndarray:
    """Epoch `epoch`'s permutation of range(n)."""
    with self._lock:
      if epoch not in self._epochs:
        order = tf.random.experimental.stateless_shuffle(tf.range(self.n, dtype=tf.int64),
                                                         seed_for(self.seed, SHUFFLE, epoch))
        self._epochs[epoch] = order.numpy()
        for old in sorted(self._epochs)[:-2]:
          del self._epochs[old]
      return self._epochs[epoch]

  def rows(self, step: int, lo: int, hi: int) -> np.ndarray:
    """Indices of rows [lo, hi) of global batch `step`."""
    epoch, k = divmod(int(step), self.steps_per_epoch)
    start = k * self.global_batch
    return self.permutation(epoch)[start + lo:start + hi]


class ShardOrder:
  """shard_by_process over a random-access source: process p reads its own contiguous 1/P of the split,
  shuffled per epoch by (seed, p); deterministic, but the batches depend on the process count."""

  def __init__(self, n: int, rows: int, seed: int, split: str, process_index: int, process_count: int):
    size = n // process_count  # Equal shards: the same batches per epoch everywhere.
    self.lo = process_index * size
    self.order = GlobalOrder(size, rows, seed * 1_000_003 + process_index, f"{split} (this process's shard)")

  def rows(self, step: int, lo: int, hi: int) -> np.ndarray:
    del lo, hi  # The whole local batch comes from this process's shard.
    return self.lo + self.order.rows(step, 0, self.order.global_batch)


def eval_rows(n: int, global_batch: int, step: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
  """(indices, mask) of rows [lo, hi) of eval batch `step`: file order, padded by repeating from the start."""
  positions = np.arange(step * global_batch + lo, step * global_batch + hi, dtype=np.int64)
  return positions % n, positions < n
