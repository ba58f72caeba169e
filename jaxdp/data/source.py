"""The random-access interface every input source implements (`Corpus`, `Source`), and its TFDS implementation."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
import os
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import tensorflow_datasets as tfds

from jaxdp.config import ConfigError

if TYPE_CHECKING:  # Annotations only: TensorFlow is imported where it is used.
  import tensorflow as tf

Rows = dict[str, np.ndarray]
Feature = tuple[tuple[int | None, ...], np.dtype]  # One example's feature as decoded: its shape and dtype.
INPUTS, LABELS = "inputs", "labels"  # The batch names of a supervised dataset's supervised keys.


@dataclasses.dataclass(frozen=True)
class Facts:
  """What the trainer and the pipeline know about a dataset, whatever stores it."""
  name: str                            # Identifies the content (name + version or digest): part of the stream spec.
  input_shape: tuple[int | None, ...]  # One example's input; None for a dimension that varies (images of any size).
  label_shape: tuple[int, ...]         # () for one class per example; (T,) for next-token labels.
  num_classes: int
  integer_inputs: bool = False         # Token ids: kept exact (never cast to a float compute dtype).
  image: bool = False                  # Inputs are images (H, W, C), decoded by `decode`, augmentable.
  float_labels: bool = False           # Labels are float targets (regression), not classes.
  # Every feature as decoded, by its batch name; empty: "inputs" and "labels" only, of the shapes above.
  features: Mapping[str, Feature] = dataclasses.field(default_factory=dict)
  left_out: Mapping[str, str] = dataclasses.field(default_factory=dict)  # Features no batch holds -> why not.

  def decoded(self) -> dict[str, Feature]:
    """Every feature as decoded (before preprocessing), by its batch name."""
    if self.features:
      return dict(self.features)
    labels = np.dtype(np.float32 if self.float_labels else np.int32)
    inputs = np.dtype(np.int32 if self.integer_inputs else np.float32)
    return {INPUTS: (tuple(self.input_shape), inputs), LABELS: (tuple(self.label_shape), labels)}


class UnreadableExample(Exception):
  """A read of an example known not to decode (a split decoded in memory holds nothing for it); says why."""


class Source(Protocol):
  """One split: `read(indices)` -> rows in the order of `indices` (repeats allowed), from any thread."""

  def __len__(self) -> int: ...

  def read(self, indices: np.ndarray) -> Rows: ...


class Corpus(Protocol):
  """A dataset: its facts, one source per split, and `decode` (TF: one read example -> its features; None: none)."""
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
    self._one_by_one = mocked(builder)

  def __len__(self) -> int:
    return len(self._records)

  def read(self, indices: np.ndarray) -> Rows:
    """{"record": bytes[n]}: the serialized examples (ArrayRecord reads a batch in parallel threads)."""
    keys = [int(i) for i in indices]
    records = [self._records[i] for i in keys] if self._one_by_one else self._records.__getitems__(keys)
    return {"record": np.array(list(records), dtype=object)}


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """A nested dict (a FeaturesDict's example or tensor infos) as one level, its keys joined with "/"."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(flatten(value, f"{prefix}{key}/"))
    else:
      out[f"{prefix}{key}"] = value
  return out


TEXT = "text or bytes: no array type on a device"  # Why a batch leaves such a feature out.


class FeatureNames:
  """A TFDS dataset's features under their batch names (flattened; "inputs"/"labels"), less text and varying shapes."""

  def __init__(self, info: tfds.core.DatasetInfo):
    keys = info.supervised_keys or ()
    supervised = len(keys) >= 2 and all(isinstance(k, str) for k in keys[:2])
    self.input_key, self.label_key = keys[:2] if supervised else (None, None)
    infos = flatten(info.features.get_tensor_info())
    rename = {self.input_key: INPUTS, self.label_key: LABELS} if supervised else {}
    if supervised and not all(k in infos for k in keys[:2]):  # A supervised key naming a nested FeaturesDict.
      self.input_key, self.label_key, rename = None, None, {}
    self.features: dict[str, Feature] = {}
    self._keys: dict[str, str] = {}  # Flattened feature name -> batch name.
    self.left_out: dict[str, str] = {}  # Flattened feature name -> why no batch holds it.
    for key, tensor in infos.items():
      name = rename.get(key, key)
      dtype = np.dtype(tensor.np_dtype)  # Not `.dtype`: TFDS's TF dtype, which loads TensorFlow.
      if key != self.input_key and (dtype == object or None in tensor.shape):
        self.left_out[key] = (TEXT if dtype == object else f"its shape {tuple(tensor.shape)} varies: rows of "
                              f"different shapes do not stack")
        continue
      if name in self.features or name in self._keys.values():
        raise ConfigError(f"dataset {info.full_name!r}: feature {key!r} and its supervised key are both {name!r} in "
                          f"a batch")
      self.features[name] = (tuple(tensor.shape), dtype)
      self._keys[key] = name

  def __call__(self, example: Mapping[str, Any]) -> dict[str, Any]:
    """One decoded example (nested as its FeaturesDict) -> its features under their batch names."""
    flat = flatten(example)
    return {name: flat[key] for key, name in self._keys.items()}


class TfdsCorpus:
  """A TFDS builder read by index; `keep_encoded`: `decode` leaves images encoded (decoded with their crop)."""

  def __init__(self, builder: tfds.core.DatasetBuilder, keep_encoded: bool = False):
    self.builder, self.keep_encoded = builder, keep_encoded
    self.names = FeatureNames(builder.info)
    self.facts = facts_of(builder, self.names)
    self._sources: dict[str, TfdsSource] = {}

  def source(self, split: str) -> TfdsSource:
    """The split's source, opened once."""
    if split not in self._sources:
      self._sources[split] = TfdsSource(self.builder, split)
    return self._sources[split]

  def decoded_mib(self) -> float | None:
    """MiB all its splits take decoded; None when the rows' shapes vary or images stay encoded (never held so)."""
    features = self.facts.decoded().values()
    if self.keep_encoded or any(None in shape for shape, _ in features):
      return None
    row_bytes = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in features)
    return row_bytes * sum(int(info.num_examples) for info in self.builder.info.splits.values()) / 2**20

  def decode(self, example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """One serialized record -> every feature under its batch name (with `keep_encoded`, images stay encoded)."""
    decoders = {self.names.input_key: tfds.decode.SkipDecoding()} if self.keep_encoded and self.facts.image else None
    return self.names(self.builder.info.features.deserialize_example(example["record"], decoders=decoders))


def facts_of(builder: tfds.core.DatasetBuilder, names: FeatureNames) -> Facts:
  """A TFDS dataset's facts: of every feature, and of its supervised pair when its batches hold one."""
  features, supervised = builder.info.features, INPUTS in names.features and LABELS in names.features
  inputs, labels = (features[k] if supervised else None for k in (names.input_key or INPUTS, names.label_key or LABELS))
  classes = getattr(labels, "num_classes", None) or getattr(getattr(labels, "feature", None), "num_classes", 0)
  image = isinstance(inputs, tfds.features.Image)
  return facts_from(builder.info.full_name, names.features, names.left_out, lambda: int(classes), image)


def facts_from(name: str, features: dict[str, Feature], left_out: Mapping[str, str], classes: Callable[[], int],
               image: bool | None = None) -> Facts:
  """The facts of `features` (their supervised pair, if any); `image` None: uint8 (H, W, C) inputs are images."""
  if INPUTS not in features or LABELS not in features:
    return Facts(name, (), (), 0, features=features, left_out=left_out)
  (input_shape, inputs), (label_shape, labels) = features[INPUTS], features[LABELS]
  image = inputs == np.uint8 and len(input_shape) == 3 if image is None else image
  float_labels = bool(np.issubdtype(labels, np.floating))
  return Facts(name, tuple(input_shape), tuple(label_shape), 0 if float_labels else classes(),
               bool(np.issubdtype(inputs, np.integer) and not image), image, float_labels, features, left_out)


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


def mocked(builder: tfds.core.DatasetBuilder) -> bool:
  """Under `tfds.testing.mock_data` preparing is a no-op: nothing will be downloaded."""
  return type(builder).download_and_prepare.__module__.startswith("tensorflow_datasets.testing")


def identity(source: Any) -> str | None:
  """A source's own identity (a Hugging Face fingerprint, or its files' paths, sizes and times), else None."""
  own = getattr(source, "_fingerprint", None) or getattr(source, "fingerprint", None)
  if isinstance(own, str):
    return own
  files = next((v for v in (getattr(source, a, None) for a in ("paths", "filenames")) if _paths(v)), None)
  try:
    return None if files is None else repr(file_stats(map(os.fspath, files)))
  except OSError:  # A named file is not there (a remote path): the rows are sampled instead.
    return None


def file_stats(paths: Iterable[str]) -> list[tuple[str, int, int]]:
  """(absolute path, size, mtime in ns) of each file: what its identity is taken from (no content read)."""
  return [(os.path.abspath(p), (st := os.stat(p)).st_size, st.st_mtime_ns) for p in paths]


def _paths(value: Any) -> bool:
  """Whether `value` is a non-empty list of file paths."""
  return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(p, (str, os.PathLike)) for p in value)
