"""TensorFlow's stateless random ops that the train order uses, in numpy: bitwise the same values without TF.

TF's stateless ops (Philox-4x32-10 on the CPU) are what the global order was defined with: an epoch's permutation
is `tf.random.experimental.stateless_shuffle(range(n), seed)` and a stream's seed comes from
`tf.random.experimental.stateless_fold_in`. These twins give the same values (tests/test_philox.py checks them
against TF over seeds and sizes), so runs that need no TF op (in-memory arrays, token files, decoded caches) never
load TensorFlow (seconds of every process's start) and keep the order of the runs that do.
"""

import numpy as np

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)  # Philox-4x32's round multipliers.
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)  # Its key increments (Weyl sequence).
_SCRAMBLE_KEY = np.array([0x3EC8F720, 0x02461E29], np.uint64)  # TF's key for turning a seed into (key, counter).
_LOW = np.uint64(0xFFFFFFFF)
DRAW_CHUNK = 2**20  # `shuffle`'s draws at a time (a multiple of 4: Philox makes 4 a counter).
KEYED_MAX = 2**31  # `swapped` sorts targets * n + step as int64 up to this n; beyond, the keys would overflow.
_32 = np.uint64(32)


def philox(counters: np.ndarray, keys: np.ndarray) -> np.ndarray:
  """Philox-4x32-10 of each counter under its key: uint [..., 4] and uint [..., 2] (broadcast) -> uint32 [..., 4]."""
  c = [counters[..., i].astype(np.uint64) for i in range(4)]
  k0, k1 = keys[..., 0].astype(np.uint64), keys[..., 1].astype(np.uint64)
  for _ in range(10):
    p0, p1 = _M0 * c[0], _M1 * c[2]  # 32 x 32 bits: exact in 64.
    c = [(p1 >> _32) ^ c[1] ^ k0, p1 & _LOW, (p0 >> _32) ^ c[3] ^ k1, p0 & _LOW]
    k0, k1 = (k0 + _W0) & _LOW, (k1 + _W1) & _LOW
  return np.stack(c, axis=-1).astype(np.uint32)


def _words(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """int64 -> (low, high) 32-bit halves of their two's complement, as uint64."""
  bits = values.astype(np.int64).view(np.uint64)
  return bits & _LOW, bits >> _32


def key_counter(seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """TF's Philox (keys uint64 [m, 2], counters uint64 [m, 4]) for stateless ops' seeds, int64 [m, 2]."""
  (lo0, hi0), (lo1, hi1) = _words(seeds[:, 0]), _words(seeds[:, 1])
  mix = philox(np.stack([lo0, hi0, lo1, hi1], axis=-1), _SCRAMBLE_KEY).astype(np.uint64)
  zeros = np.zeros(len(seeds), np.uint64)
  return mix[:, :2], np.stack([zeros, zeros, mix[:, 2], mix[:, 3]], axis=-1)


def draws(seeds: np.ndarray, n: int, first: int = 0) -> np.ndarray:
  """Draws first, ..., first + n - 1 (`first` a multiple of 4) of the stateless generator of each seed (int64
  [m, 2]): uint32 [m, n], TF's order.

  A seed's counters are its (key, counter)'s counter plus 0, 1, ...: its low 64 bits start at 0, so for fewer
  than 2**34 draws they never carry into the high ones.
  """
  assert first % 4 == 0, first
  keys, start = key_counter(np.asarray(seeds, np.int64).reshape(-1, 2))
  groups = np.arange(first // 4, first // 4 + -(-n // 4), dtype=np.uint64)
  counters = np.broadcast_to(start[:, None, :], (len(start), len(groups), 4)).copy()
  counters[..., 0] = groups
  return philox(counters, keys[:, None, :]).reshape(len(start), -1)[:, :n]


def uniform(seeds: np.ndarray, n: int) -> np.ndarray:
  """`tf.random.stateless_uniform([n], seed)` (float32 in [0, 1)) for each seed: float32 [m, n]; a draw's low 23
  bits are the mantissa of a float in [1, 2), less 1."""
  return ((draws(seeds, n) & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000)).view(np.float32) - np.float32(1)


def fold_in(seed: tuple[int, int], data: int | np.ndarray) -> np.ndarray:
  """`tf.random.experimental.stateless_fold_in(seed, data)`: int64 [2], or [m, 2] for int64 data [m]; TF's is
  (a full-range int64 draw of `seed`, `data`)."""
  low, high = draws(np.array([seed]), 2)[0].astype(np.uint64)  # The draw's first word is its low half.
  first = (high << _32 | low).view(np.int64)
  data = np.asarray(data, np.int64)
  return np.stack([np.broadcast_to(first, data.shape), data], axis=-1)


def shuffle(n: int, seed: np.ndarray) -> np.ndarray:
  """`tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int64), seed)` as int64 [n]."""
  if n <= 1:
    return np.arange(n, dtype=np.int64)
  # TF's Fisher-Yates: position i swaps with i + draw % (n - i). Drawn in chunks: Philox's temporaries are a few
  # times the draws' size, which for a split of millions of rows would be hundreds of MiB at once.
  targets = np.empty(n - 1, np.int64)
  for lo in range(0, n - 1, DRAW_CHUNK):
    hi = min(lo + DRAW_CHUNK, n - 1)
    positions = np.arange(lo, hi, dtype=np.uint64)
    targets[lo:hi] = positions + draws(seed, hi - lo, first=lo)[0].astype(np.uint64) % (np.uint64(n) - positions)
  return swapped(targets)


def swapped(targets: np.ndarray) -> np.ndarray:
  """range(n) after swapping position i with targets[i] >= i for i = 0, 1, ..., n - 2 in turn, as int64 [n].

  The swaps run in turn, but their result has a closed form that numpy computes at once (a Python loop took
  0.7 s at 1.28M rows, holding the GIL, once an epoch; this 0.24 s, in numpy): a swap at step k carries the value
  then at position k, call it V(k), to targets[k], where it stays until the next swap to touch that position. So
  the value at position p before step p is V(k) for the last earlier step k that swapped with p (its `parent`),
  else p itself: V is a root of the parent forest, found by pointer doubling. Step i (targets[i] > i) then takes
  from targets[i] the value the last earlier step with the same target left there, V of that step, else the
  untouched targets[i]; with targets[i] == i, V(i) stays.
  """
  n = len(targets) + 1
  # Each temporary is n int64s and a split may have millions of rows: they are made in place and dropped as soon
  # as they are used (docs/design-notes.md#input-pipeline-choices).
  if n <= KEYED_MAX:  # The steps grouped by target, each group in step order: one fast sort of int64 keys.
    keys = targets * n
    keys += np.arange(n - 1, dtype=np.int64)
    keys.sort()
    sorted_targets = keys // n
    by_target = np.remainder(keys, n, out=keys)
    del keys
  else:  # The keys would overflow int64: a stable sort, twice as slow.
    by_target = np.argsort(targets, kind="stable")
    sorted_targets = targets[by_target]
  same = sorted_targets[1:] == sorted_targets[:-1]
  del sorted_targets
  before = np.full(n - 1, -1, np.int64)  # The last earlier step with the same target.
  before[by_target[1:][same]] = by_target[:-1][same]
  del by_target, same
  steps = np.arange(n - 1, dtype=np.int64)
  moved = targets != steps
  parent = np.full(n, -1, np.int64)  # A target's groups hold only steps <= it: the largest one that moved.
  np.maximum.at(parent, targets[moved], steps[moved])
  del steps
  root = np.arange(n)
  np.copyto(root, parent, where=parent >= 0)
  del parent
  while not np.array_equal(jumped := root[root], root):
    root = jumped
  del jumped
  earlier = before >= 0
  taken = root[np.maximum(before, 0, out=before)]
  del before
  np.copyto(taken, targets, where=~earlier)
  np.copyto(root[:-1], taken, where=moved)  # The last position is never a step's: it keeps its root.
  return root
