"""Splits that fit `dataset.cache_mb` decoded once into files beside the prepared dataset (`jaxdp_decoded/<split>/`,
renamed into place under a file lock), read by numpy gathers (docs/design-notes.md#input-pipeline-choices)."""

import contextlib
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import tensorflow_datasets as tfds

from jaxdp.config import ConfigError
from jaxdp.data import bad_examples, reader
from jaxdp.data.source import Rows, Source, TfdsCorpus, UnreadableExample

log = logging.getLogger("jaxdp")
_READ_CHUNK = 1024  # Records read per call while decoding a split.
FOLDER = "jaxdp_decoded"
FORMAT = 1  # The files' layout; part of their names, so another layout never reads them.
Decoded = tuple[Rows, dict[int, str]]  # The split's arrays, and its examples that do not decode ({index: why}).


class DecodedSource:
  """A split held decoded; reading an example in `bad` ({index: why}: it did not decode) raises `UnreadableExample`."""

  def __init__(self, arrays: Rows, bad: dict[int, str] | None = None):
    self._arrays, self.bad = arrays, dict(bad or {})

  def __len__(self) -> int:
    return len(next(iter(self._arrays.values())))

  def read(self, indices: np.ndarray) -> Rows:
    if self.bad and (unreadable := [int(i) for i in indices if int(i) in self.bad]):
      raise UnreadableExample(self.bad[unreadable[0]])
    return {k: v[indices] for k, v in self._arrays.items()}


class CachedCorpus:
  """A `TfdsCorpus` whose splits are decoded when first opened, and mapped from their files (else held in memory)."""
  decode = None

  def __init__(self, corpus: TfdsCorpus):
    self.corpus, self.facts = corpus, corpus.facts
    self._sources: dict[str, DecodedSource] = {}

  def source(self, split: str) -> DecodedSource:
    if split not in self._sources:
      self._sources[split] = DecodedSource(*self._decoded(split))
    return self._sources[split]

  def _decoded(self, split: str) -> Decoded:
    """The split's arrays and bad examples: mapped from their files, or decoded now."""
    def decode() -> Decoded:
      return decode_all(self.corpus.source(split), self.corpus.decode, split)

    builder = self.corpus.builder
    try:
      files = [os.fspath(f) for f in builder.info.splits[split].filepaths]
      digest = identity(split, files, self.facts.decoded())
    except (OSError, KeyError, ValueError, AttributeError, TypeError):  # No files to name it by (mocked, a slice):
      return decode()                                                  # decoded in memory; an unknown split fails there.
    return load_or_decode(os.fspath(builder.data_dir), split, digest, decode)


def maybe_cached(corpus: TfdsCorpus, max_mib: float) -> TfdsCorpus | CachedCorpus:
  """`corpus` decoded once (`CachedCorpus`) when all its splits fit in `max_mib` MiB decoded."""
  mib = corpus.decoded_mib()
  return CachedCorpus(corpus) if max_mib > 0 and mib is not None and mib <= max_mib else corpus


def decode_all(source: Source, decode: Callable[[dict], dict], split: str) -> Decoded:
  """Every row of `split`, decoded in index order; and the examples that do not decode ({index: why}: zero rows)."""
  tf = reader.tensorflow()
  try:
    return _decoded(source, decode), {}
  except tf.errors.OpError:  # Some example does not decode (or the read failed): find which, one chunk at a time.
    return _decoded_but_bad(source, decode, split)


def _decoded(source: Source, decode: Callable[[dict], dict]) -> Rows:
  """Every row, decoded in parallel chunks copied into the split's arrays as they arrive (never both held)."""
  tf = reader.tensorflow()
  n = len(source)
  indices = np.arange(n)
  probe = source.read(indices[:1])
  spec = reader.decoded_spec(probe, decode, position=False)
  arrays = {k: np.empty((n, *s.shape), s.dtype.as_numpy_dtype) for k, s in spec.items()}
  for a in arrays.values():  # Pages touched before the decode starts, not while its threads run.
    a.fill(0)
  chunks = tf.data.Dataset.from_tensor_slices(indices).batch(_READ_CHUNK).map(reader.tf_read(probe, source.read))
  lo = 0
  for part in tfds.as_numpy(reader.decode_rows(chunks, decode, spec)):
    rows = len(next(iter(part.values())))
    for k, a in arrays.items():
      a[lo:lo + rows] = part[k]
    lo += rows
  return arrays


def _decoded_but_bad(source: Source, decode: Callable[[dict], dict], split: str) -> Decoded:
  """Every row of the split that decodes, in index order (zeros for the others), and why each other did not."""
  tf = reader.tensorflow()
  n = len(source)
  good, parts = [], []
  for lo in range(0, n, _READ_CHUNK):
    indices = np.arange(lo, min(n, lo + _READ_CHUNK))
    examples = tf.data.Dataset.from_tensor_slices(source.read(indices))  # A read that fails raises here, as itself.
    decoded = tf.data.Dataset.zip(tf.data.Dataset.from_tensor_slices(indices), examples.map(
        decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)).ignore_errors()
    for index, rows in tfds.as_numpy(decoded):
      good.append(index)
      parts.append(rows)
  if not parts:
    raise ConfigError(f"no example of split {split!r} decodes (tried all {n}): {_why(source, decode, 0)}")
  arrays = {k: np.zeros((n, *parts[0][k].shape), parts[0][k].dtype) for k in parts[0]}
  for k, a in arrays.items():
    a[good] = np.stack([p[k] for p in parts])
  return arrays, {i: _why(source, decode, i) for i in sorted(set(range(n)) - set(good))}


def _why(source: Source, decode: Callable[[dict], dict], index: int) -> str:
  """TensorFlow's first line on example `index` decoding alone."""
  tf = reader.tensorflow()
  try:
    for _ in tf.data.Dataset.from_tensor_slices(source.read(np.array([index]))).map(decode):
      pass
  except tf.errors.OpError as e:
    return bad_examples.reason_of(e)
  return "it did not decode with the others"


def identity(split: str, files: list[str], features: dict[str, tuple[tuple[int, ...], np.dtype]]) -> str:
  """A digest of what the decoded split depends on: its prepared files (name, size, mtime) and decoded features."""
  stats = [(os.path.basename(f), os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in sorted(files)]
  facts = sorted((k, list(shape), np.dtype(dtype).str) for k, (shape, dtype) in features.items())
  return hashlib.sha256(json.dumps([FORMAT, split, stats, facts]).encode()).hexdigest()[:16]


def load_or_decode(folder: str, split: str, digest: str, decode: Callable[[], Decoded]) -> Decoded:
  """The split mapped from its files under `folder`, else `decode()`d and written there (or, if it cannot be, held)."""
  if not os.path.isdir(folder):  # Not local (gs://...), or not there: nothing to map.
    return decode()
  here = os.path.join(folder, FOLDER, split)
  stem = os.path.join(here, f"v{FORMAT}-{digest}")
  decoded = None
  try:
    with locked(here, ".lock"):
      if (found := read(stem)) is not None:
        return found
      decoded = decode()
      _write(stem, *decoded)
  except ConfigError:
    raise
  except (OSError, ValueError) as e:  # No lock; a full disk; a feature numpy cannot save without pickling.
    if decoded is None and (found := read(stem)) is not None:  # Files written by another (complete ones are only
      return found                                               # ever renamed into place) still map.
    log.warning("dataset split %r is decoded in memory: cannot write its decoded copy in %s (%s)", split, here,
                getattr(e, "strerror", None) or e)  # A ValueError has no strerror.
    return decoded or decode()
  return read(stem) or decoded  # Mapped: this process's decoded copy is released.


@contextlib.contextmanager
def locked(folder: str, name: str) -> Iterator[None]:
  """Holds the lock file `folder/name` (one holder per host; released by the kernel if the process dies)."""
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, name), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def read(stem: str) -> Decoded | None:
  """The split's arrays mapped read-only from `stem`'s files, and its bad examples; None unless all are complete."""
  try:
    with open(f"{stem}.json") as f:
      meta = json.load(f)
    arrays = {k: _mapped(f"{stem}.{i}.npy", meta["rows"], spec) for i, (k, spec) in enumerate(meta["features"].items())}
    return arrays, {int(i): why for i, why in meta["bad"].items()}
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _mapped(path: str, rows: int, spec: dict) -> np.ndarray:
  """The `.npy` file at `path` mapped read-only (ValueError when not as `spec` says, or short)."""
  a = np.load(path, mmap_mode="r", allow_pickle=False)
  if a.shape != (rows, *spec["shape"]) or a.dtype != np.dtype(spec["dtype"]):
    raise ValueError(f"{path}: {a.shape} {a.dtype}, expected {rows} rows of {spec}")
  return a.view(np.ndarray)  # Gathers from it give plain arrays; the mapping lives as long as the view.


def _write(stem: str, arrays: Rows, bad: dict[int, str]) -> None:
  """Writes the arrays, then the `.json`, each renamed when complete; then drops leftovers (its own, if it failed)."""
  tmp, ours, here = f".tmp-{os.getpid()}", os.path.basename(stem) + ".", os.path.dirname(stem)
  written = False
  try:
    for i, a in enumerate(arrays.values()):
      with open(f"{stem}.{i}.npy{tmp}", "wb") as f:
        np.save(f, np.ascontiguousarray(a), allow_pickle=False)
      os.replace(f"{stem}.{i}.npy{tmp}", f"{stem}.{i}.npy")
    meta = {"rows": len(next(iter(arrays.values()))),
            "features": {k: {"shape": list(a.shape[1:]), "dtype": a.dtype.str} for k, a in arrays.items()},
            "bad": {str(i): why for i, why in bad.items()}}
    with open(f"{stem}.json{tmp}", "w") as f:
      json.dump(meta, f)
    os.replace(f"{stem}.json{tmp}", f"{stem}.json")
    written = True
  finally:  # Others' files, or its own: without their .json nothing reads them; each may be a feature's size.
    _remove(os.path.join(here, n) for n in os.listdir(here)
            if n != ".lock" and (".tmp-" in n or n.startswith(ours) != written))


def _remove(paths: Iterable[str]) -> None:
  """Removes what it can of `paths` (leftovers; nothing else reads them: the lock is held)."""
  for path in paths:
    with contextlib.suppress(OSError):
      os.remove(path)
