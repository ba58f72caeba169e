"""Datasets that fit in memory decoded once: every read is then a numpy gather instead of parsing and decoding.

Reading by index decodes each step's rows anew (parse the record, decode the PNG), on the cores the step needs
(docs/design-notes.md#input-pipeline-choices). A dataset whose splits,
decoded, take at most `dataset.cache_mb` MiB together ("auto": up to 1 GiB, by the machine's memory:
`dataset.cache_budget_mib`) is decoded once, when a split is first opened, by the same `decode`, in index order; the stream then reads the same rows in the same order and
yields the same bytes (tested), and its stream spec does not change. Images of varying size
(`dataset.image_size`) stay encoded and are never cached: they are decoded together with their crop.

An example that does not decode is found while decoding the split (only once the parallel decode has failed):
the split is held without it, and reading it raises `UnreadableExample`, so that the bad-example guard
names it, or replaces it exactly as it would when reading by index (`dataset.skip_bad_examples`).
"""

import os
from collections.abc import Callable

import numpy as np
import tensorflow_datasets as tfds

from jaxdp.config import ConfigError
from jaxdp.data import bad_examples, cache_files, reader, tf_setup
from jaxdp.data.source import Rows, Source, TfdsCorpus, UnreadableExample, tf_read

_READ_CHUNK = 1024  # Records read per call while decoding a split.


class DecodedSource:
  """A split held decoded in memory (every feature); reads are numpy gathers.

  `bad`: the indices of the examples that did not decode, and why; reading one raises `UnreadableExample`.
  """

  def __init__(self, arrays: Rows, bad: dict[int, str] | None = None):
    self._arrays, self.bad = arrays, dict(bad or {})

  def __len__(self) -> int:
    return len(next(iter(self._arrays.values())))

  def read(self, indices: np.ndarray) -> Rows:
    if self.bad and (unreadable := [int(i) for i in indices if int(i) in self.bad]):
      raise UnreadableExample(self.bad[unreadable[0]])
    return {k: v[indices] for k, v in self._arrays.items()}


class CachedCorpus:
  """A `TfdsCorpus` whose splits are decoded once, when first opened, and kept in files beside the prepared dataset
  that every later open maps (`cache_files`: in memory where they cannot be written)."""
  decode = None

  def __init__(self, corpus: TfdsCorpus):
    self.corpus, self.facts = corpus, corpus.facts
    self._sources: dict[str, DecodedSource] = {}

  def source(self, split: str) -> DecodedSource:
    if split not in self._sources:
      self._sources[split] = DecodedSource(*self._decoded(split))
    return self._sources[split]

  def _decoded(self, split: str) -> cache_files.Decoded:
    """The split's arrays and bad examples: mapped from their files, or decoded now."""
    def decode() -> cache_files.Decoded:
      return decode_all(self.corpus.source(split), self.corpus.decode, split)

    builder = self.corpus.builder
    try:
      files = [os.fspath(f) for f in builder.info.splits[split].filepaths]
      digest = cache_files.identity(split, files, self.facts.decoded())
    except (OSError, KeyError, ValueError, AttributeError, TypeError):  # No files to name it by (mocked, a slice):
      return decode()                                                  # decoded in memory; an unknown split fails there.
    return cache_files.load_or_decode(os.fspath(builder.data_dir), split, digest, decode)


def maybe_cached(corpus: TfdsCorpus, max_mib: float) -> TfdsCorpus | CachedCorpus:
  """`corpus` decoded once (`CachedCorpus`) when all its splits fit in `max_mib` MiB decoded."""
  mib = corpus.decoded_mib()
  return CachedCorpus(corpus) if max_mib > 0 and mib is not None and mib <= max_mib else corpus


def decode_all(source: Source, decode: Callable[[dict], dict], split: str) -> tuple[Rows, dict[int, str]]:
  """Every feature of every row of `split` (`source`), decoded in parallel, in index order; and the examples that do
  not decode ({index: why}: their rows are zeros)."""
  tf = tf_setup.tensorflow()
  try:
    return _decoded(source, decode), {}
  except tf.errors.OpError:  # Some example does not decode (or the read failed): find which, one chunk at a time.
    return _decoded_but_bad(source, decode, split)


def _decoded(source: Source, decode: Callable[[dict], dict]) -> Rows:
  """Every row of the split, decoded in parallel (a chunk of rows at a time), in index order.

  Each chunk is copied into the split's arrays as it arrives: the decoded chunks and the whole split are never
  held together, as a list of chunks concatenated at the end was (docs/design-notes.md#input-pipeline-choices).
  """
  tf = tf_setup.tensorflow()
  n = len(source)
  indices = np.arange(n)
  probe = source.read(indices[:1])
  spec = reader.decoded_spec(probe, decode, position=False)
  arrays = {k: np.empty((n, *s.shape), s.dtype.as_numpy_dtype) for k, s in spec.items()}
  for a in arrays.values():  # Pages touched before the decode starts, not while its threads run (data_notes.md).
    a.fill(0)
  chunks = tf.data.Dataset.from_tensor_slices(indices).batch(_READ_CHUNK).map(tf_read(probe, source.read))
  lo = 0
  for part in tfds.as_numpy(reader.decode_rows(chunks, decode, spec)):
    rows = len(next(iter(part.values())))
    for k, a in arrays.items():
      a[lo:lo + rows] = part[k]
    lo += rows
  return arrays


def _decoded_but_bad(source: Source, decode: Callable[[dict], dict], split: str) -> tuple[Rows, dict[int, str]]:
  """Every row of the split that decodes, in index order (zeros for the others), and why each other did not."""
  tf = tf_setup.tensorflow()
  n, one = len(source), decode
  good, parts = [], []
  for lo in range(0, n, _READ_CHUNK):
    indices = np.arange(lo, min(n, lo + _READ_CHUNK))
    examples = tf.data.Dataset.from_tensor_slices(source.read(indices))  # A read that fails raises here, as itself.
    decoded = tf.data.Dataset.zip(tf.data.Dataset.from_tensor_slices(indices), examples.map(
        one, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)).ignore_errors()
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
  tf = tf_setup.tensorflow()
  try:
    for _ in tf.data.Dataset.from_tensor_slices(source.read(np.array([index]))).map(decode):
      pass
  except tf.errors.OpError as e:
    return bad_examples.reason_of(e)
  return "it did not decode with the others"
