"""The one global order: which examples global batch `step` holds, a pure function of (seed, step)."""

import collections
import threading

import numpy as np

from jaxdp.config import ConfigError

SHUFFLE, AUGMENT = 1, 2  # Stream ids: the epoch shuffles and the augmentation draws never share a generator.

# Permutations kept (n int64 each), shared by every `GlobalOrder` of the same (n, seed) (the stream's and the audit's):
# the epoch in use, the next (reading ahead), a straggler (a tf.data worker) and the audit's behind. Others are redrawn.
EPOCHS_HELD = 4
_held: collections.OrderedDict[tuple[int, int, int], np.ndarray] = collections.OrderedDict()  # Least recent first.
_held_lock = threading.Lock()


def rng(seed: int, stream: int, counter: int) -> np.random.Generator:
  """Philox keyed by (seed, stream, counter: an epoch or a step): any one drawn alone, on any process, in any order."""
  return np.random.Generator(np.random.Philox(np.random.SeedSequence([seed % 2**64, stream, counter % 2**64])))


class GlobalOrder:
  """Example indices of every global batch of the train stream; thread-safe."""

  def __init__(self, n: int, global_batch: int, seed: int, split: str):
    self.n, self.global_batch, self.seed = n, global_batch, seed
    if n < global_batch:
      raise ConfigError(f"batch ({global_batch}) exceeds the {n} examples of split {split!r}: lower "
                        "--config.batch_size, or train on more examples (for an image folder or a text file: a "
                        "smaller --config.dataset.builder_kwargs.test_fraction)")
    self.steps_per_epoch = n // global_batch  # Whole global batches: the last n % global_batch sit the epoch out.

  def permutation(self, epoch: int) -> np.ndarray:
    """Epoch `epoch`'s permutation of range(n): the same array for any caller, thread or order of calls."""
    return permutation(self.n, self.seed, epoch)

  def rows(self, step: int, lo: int, hi: int) -> np.ndarray:
    """Indices of rows [lo, hi) of global batch `step`."""
    epoch, k = divmod(int(step), self.steps_per_epoch)
    start = k * self.global_batch
    return self.permutation(epoch)[start + lo:start + hi]


def permutation(n: int, seed: int, epoch: int) -> np.ndarray:
  """Epoch `epoch`'s permutation of range(n) under `seed` (read-only: one array shared by every caller)."""
  key = (n, seed, epoch)
  with _held_lock:
    order = _held.get(key)
  if order is None:  # Computed outside the lock: other threads read the epochs held meanwhile.
    order = rng(seed, SHUFFLE, epoch).permutation(n)
    order.flags.writeable = False
  with _held_lock:
    order = _held.setdefault(key, order)
    _held.move_to_end(key)
    while len(_held) > EPOCHS_HELD:
      _held.popitem(last=False)  # Never `key`, the most recent: `order` is returned as it is.
  return order


def eval_rows(n: int, global_batch: int, step: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
  """(indices, mask) of rows [lo, hi) of eval batch `step`: file order, padded by repeating from the start."""
  positions = np.arange(step * global_batch + lo, step * global_batch + hi, dtype=np.int64)
  return positions % n, positions < n
