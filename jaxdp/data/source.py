"""The random-access interface every input source implements, and its TFDS (ArrayRecord) implementation.

The pipeline (`jaxdp.data`) needs only two things from storage:

- a `Corpus`: the facts the trainer needs (`Facts`: input shape, classes, ...) and one `Source` per split;
- a `Source`: `len(source)` examples, and `source.read(indices)` -> a dict of numpy arrays whose leading
  axis follows `indices` (global positions in the split, any order, repeats allowed). It must be safe
  to call from several threads and must not hold anything proportional to the split in memory.

What `read` returns goes through `corpus.decode` (a TF function of ONE example's dict, run in parallel
tf.data workers) to `{"inputs": ..., "labels": ...}` (with `dataset.image_size`: still-encoded image
bytes, which the pipeline decodes together with their crop); a corpus whose `read` already returns those two
keys as final arrays sets `decode = None` (e.g. a token file: int32 windows, nothing to decode).

A kind of dataset (`jaxdp.data.kinds`) opens a corpus: `tfds_dataset` a `TfdsCorpus` for TFDS builders
(or, when small, `cache.CachedCorpus`); `token_file` an `ArrayCorpus` of token windows, e.g.

    facts = Facts(name="token_file:train.bin@<digest>", input_shape=(T,), label_shape=(T,),
                  num_classes=vocab_size, integer_inputs=True)
    ArrayCorpus(facts, {"train": TokenWindows(...), "test": TokenWindows(...)})   # decode = None
"""

import dataclasses
from collections.abc import Callable
from typing import Protocol

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from jaxdp.config import ConfigError
from jaxdp.data import offline

Rows = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Facts:
  """What the trainer and the pipeline know about a dataset, whatever stores it."""
  name: str                            # Identifies the content (name + version or digest): part of the stream spec.
  input_shape: tuple[int | None, ...]  # One example's input; None for a dimension that varies (images of any size).
  label_shape: tuple[int, ...]         # () for one class per example; (T,) for next-token labels.
  num_classes: int
  integer_inputs: bool = False         # Token ids: kept exact (never cast to a float compute dtype).
  image: bool = False                  # Inputs are images (H, W, C), decoded by `decode`, augmentable.


class UnreadableExample(Exception):
  """A read of an example known not to decode (a split decoded in memory holds nothing for it): the message says
  why it did not; the bad-example guard (`jaxdp.data.bad_examples`) names or replaces it like any other."""


class Source(Protocol):
  """One split, read by global index."""

  def __len__(self) -> int: ...

  def read(self, indices: np.ndarray) -> Rows: ...


class Corpus(Protocol):
  """A dataset: its facts, one source per split, and how one read example becomes inputs and labels."""
  facts: Facts
  decode: Callable[[dict[str, tf.Tensor]], dict[str, tf.Tensor]] | None

  def source(self, split: str) -> Source:
    """The split's source; called once per stream and per count, so open it once."""
    ...


class TfdsSource:
  """A split of a TFDS dataset prepared as ArrayRecord: serialized records, read in batches by index."""

  def __init__(self, builder: tfds.core.DatasetBuilder, split: str):
    try:
      self._records = builder.as_data_source(split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
    except (KeyError, ValueError, AssertionError) as e:
      raise ConfigError(f"unknown split {split!r} of dataset {builder.name!r}: {e}") from None
    # tfds.testing.mock_data's batched read is broken (an unbound `__getitems__`); its single reads work.
    self._one_by_one = offline.mocked(builder)

  def __len__(self) -> int:
    return len(self._records)

  def read(self, indices: np.ndarray) -> Rows:
    """{"record": bytes[n]}: the serialized examples (ArrayRecord reads a batch in parallel threads)."""
    keys = [int(i) for i in indices]
    records = [self._records[i] for i in keys] if self._one_by_one else self._records.__getitems__(keys)
    return {"record": np.array(list(records), dtype=object)}


class TfdsCorpus:
  """A TFDS builder read through random-access data sources, with its supervised keys."""

  def __init__(self, builder: tfds.core.DatasetBuilder, keep_encoded: bool = False):
    """`keep_encoded`: `decode` leaves images encoded (the pipeline decodes them with their crop)."""
    self.builder, self.keep_encoded = builder, keep_encoded
    self.input_key, self.label_key = builder.info.supervised_keys[:2]
    features = builder.info.features
    inputs, labels = features[self.input_key], features[self.label_key]
    image = isinstance(inputs, tfds.features.Image)
    integer = not image and np.issubdtype(np.dtype(inputs.np_dtype), np.integer)
    classes = getattr(labels, "num_classes", None) or getattr(getattr(labels, "feature", None), "num_classes", 0)
    self.facts = Facts(builder.info.full_name, tuple(inputs.shape), tuple(labels.shape), int(classes), integer, image)
    self._sources: dict[str, TfdsSource] = {}

  def source(self, split: str) -> TfdsSource:
    """The split's source, opened once."""
    if split not in self._sources:
      self._sources[split] = TfdsSource(self.builder, split)
    return self._sources[split]

  def decode(self, example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """One serialized record -> {"inputs", "labels"}, decoded by the features' own TF code (as `as_dataset`).

    With `keep_encoded`, images stay encoded: the pipeline decodes them together with their crop.
    """
    decoders = {self.input_key: tfds.decode.SkipDecoding()} if self.keep_encoded and self.facts.image else None
    parsed = self.builder.info.features.deserialize_example(example["record"], decoders=decoders)
    return {"inputs": parsed[self.input_key], "labels": parsed[self.label_key]}


class ArrayCorpus:
  """Splits that already read final arrays ({"inputs", "labels"}, e.g. token windows): nothing to decode."""
  decode = None

  def __init__(self, facts: Facts, splits: dict[str, Source]):
    self.facts, self._splits = facts, splits

  def source(self, split: str) -> Source:
    if split not in self._splits:
      choices = ", ".join(self._splits)
      raise ConfigError(f"unknown split {split!r} of dataset {self.facts.name!r} (choose from {choices})")
    return self._splits[split]


def tf_read(probe: Rows, read: Callable[[np.ndarray], Rows]) -> Callable[[tf.Tensor], dict[str, tf.Tensor]]:
  """`read` (numpy indices -> numpy rows) as a tf.data function, its outputs typed after `probe` (rows it returned).

  A read that raises `UnreadableExample` fails as a TF op (its message, no Python traceback logged by the worker).
  """
  keys = sorted(probe)
  dtypes = [tf.string if probe[k].dtype == object else tf.as_dtype(probe[k].dtype) for k in keys]

  def read_once(a: np.ndarray) -> list[np.ndarray]:
    try:
      rows, why = read(a), ""  # One read per call, whatever the number of features.
    except UnreadableExample as e:
      rows, why = probe, str(e)  # Typed as the outputs; the assertion below fails before anything reads them.
    return [rows[k] for k in keys] + [np.array(why.encode(), object)]

  def call(x: tf.Tensor) -> dict[str, tf.Tensor]:
    *arrays, why = tf.numpy_function(read_once, [x], [*dtypes, tf.string], stateful=False)
    with tf.control_dependencies([tf.debugging.Assert(tf.equal(why, ""), [why])]):
      return {k: tf.identity(a) for k, a in zip(keys, arrays)}

  return call
