"""Small datasets decoded once, in memory: every read is then a numpy gather instead of parsing and decoding.

Reading by index decodes each step's rows anew (parse the record, decode the PNG): on `digits` that is about
5 ms of CPU per 64-row batch, as much as the small CNN's step itself, spent on the same cores. A dataset
whose splits, decoded, take at most `dataset.cache_mb` MiB together is decoded once, when a split is first
opened, by the same `decode`, in index order; the stream then reads the same rows in the same order and
yields the same bytes (tested), and its stream spec does not change. Images of varying size
(`dataset.image_size`) stay encoded and are never cached: they are decoded together with their crop.
"""

from collections.abc import Callable

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from jaxdp.data.source import Rows, Source, TfdsCorpus, tf_read

_READ_CHUNK = 1024  # Records read per call while decoding a split.


class DecodedSource:
  """A split held decoded in memory ({"inputs", "labels"}); reads are numpy gathers."""

  def __init__(self, arrays: Rows):
    self._arrays = arrays

  def __len__(self) -> int:
    return len(self._arrays["labels"])

  def read(self, indices: np.ndarray) -> Rows:
    return {k: v[indices] for k, v in self._arrays.items()}


class CachedCorpus:
  """A `TfdsCorpus` whose splits are decoded once, when first opened; nothing left to decode per step."""
  decode = None

  def __init__(self, corpus: TfdsCorpus):
    self.corpus, self.facts = corpus, corpus.facts
    self._sources: dict[str, DecodedSource] = {}

  def source(self, split: str) -> DecodedSource:
    if split not in self._sources:
      self._sources[split] = DecodedSource(decode_all(self.corpus.source(split), self.corpus.decode))
    return self._sources[split]


def maybe_cached(corpus: TfdsCorpus, splits: dict[str, int], max_mib: float) -> TfdsCorpus | CachedCorpus:
  """`corpus` decoded in memory when all its `splits` (name -> examples) fit in `max_mib` MiB decoded."""
  features = corpus.builder.info.features
  inputs, labels = features[corpus.input_key], features[corpus.label_key]
  if max_mib <= 0 or corpus.keep_encoded or None in (*inputs.shape, *labels.shape):
    return corpus
  row_bytes = sum(int(np.prod(f.shape)) * np.dtype(f.np_dtype).itemsize for f in (inputs, labels))
  return CachedCorpus(corpus) if row_bytes * sum(splits.values()) <= max_mib * 2**20 else corpus


def decode_all(source: Source, decode: Callable[[dict], dict]) -> Rows:
  """{"inputs", "labels"} of every row of the split, decoded in parallel, in index order."""
  indices = np.arange(len(source))
  read = tf_read(source.read(indices[:1]), source.read)

  def one(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    decoded = decode(example)
    return {"inputs": decoded["inputs"], "labels": decoded["labels"]}

  rows = tf.data.Dataset.from_tensor_slices(indices).batch(_READ_CHUNK).map(read).unbatch()
  rows = rows.map(one, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).batch(_READ_CHUNK)
  parts = list(tfds.as_numpy(rows))
  return {k: np.concatenate([p[k] for p in parts]) for k in ("inputs", "labels")}
