"""Data given as Python objects (`data.load(config.dataset, train_data=..., eval_data=...)`): a dict of numpy arrays
of one leading length, or any random-access source (`len()`, `__getitem__(i) -> dict`, optionally
`__getitems__(indices) -> list of dicts`: a `tfds.data_source`, a Hugging Face `datasets.Dataset`, a Grain source).

Each is one split (`train_data` the train split, `eval_data` the eval split, under the config's split names), read by
index in jaxdp's global order like any other source (in parallel tf.data workers), so every guarantee holds. Every
feature is a key of the dict (nested dicts flattened with "/"; "inputs"/"labels", when present, are the supervised
pair); keys whose values are not numeric (text) are left out, as for TFDS. Nothing is prepared or written (no
~/tensorflow_datasets). The dataset's name is "<in-memory>@DIGEST", a digest of the data (every byte of a dict of
arrays; a source's own identity where it has one (`source_identity`), else its length and a fixed sample of its
rows): it is in the
stream spec, so a checkpoint of other data is refused on resume like a changed seed.
"""

import hashlib
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np

from jaxdp.config import ConfigError
from jaxdp.data import source_identity
from jaxdp.data.dataset import Dataset, Options
from jaxdp.data.source import INPUTS, LABELS, TEXT, ArrayCorpus, Facts, Rows, flatten

NAME = "<in-memory>"  # The dataset's name before its digest.
KIND = "in-memory"     # Its source kind in the stream spec.
SAMPLE_ROWS = 64       # Rows of a source without a fingerprint that its digest reads.
_CHUNK = 1024          # Rows per read while counting a source's classes.


def is_arrays(data: Any) -> bool:
  """Whether `data` is a dict of arrays (else it must be a random-access source)."""
  return isinstance(data, Mapping)


class ArraysSource:
  """A split held as a dict of numpy arrays (flattened with "/"), all of one leading length."""

  def __init__(self, arrays: Mapping[str, Any], what: str):
    flat = {k: np.asarray(v) for k, v in flatten(arrays).items()}
    self.arrays = {k: v for k, v in flat.items() if _numeric(v.dtype)}
    self.left_out = {k: _why(v.dtype) for k, v in flat.items() if k not in self.arrays}
    lengths = {k: v.shape[0] if v.ndim else None for k, v in self.arrays.items()}
    if not self.arrays or len(set(lengths.values())) != 1 or None in lengths.values():
      raise ConfigError(f"{what} must be a dict of numeric arrays of one leading length (one row per example), got "
                        + (", ".join(f"{k} {v.shape} {v.dtype}" for k, v in flat.items()) or "no arrays"))

  def __len__(self) -> int:
    return len(next(iter(self.arrays.values())))

  def read(self, indices: np.ndarray) -> Rows:
    return {k: v[indices] for k, v in self.arrays.items()}

  def digest(self, h: "hashlib._Hash") -> None:
    _digest_rows(h, self.arrays)


class RandomAccessSource:
  """A split that is a random-access source of example dicts: rows read by `__getitems__`, else one by one."""

  def __init__(self, source: Any, what: str):
    if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
      raise ConfigError(f"{what} must be a dict of numpy arrays or a random-access source (len() and "
                        f"__getitem__(i) -> dict of arrays), got {type(source).__name__}")
    self.source, self.what = source, what
    if not len(source):
      raise ConfigError(f"{what} has no examples")
    first = self._rows([0])
    self.keys = tuple(k for k, v in first.items() if _numeric(v.dtype))
    self.left_out = {k: _why(v.dtype) for k, v in first.items() if k not in self.keys}
    if not self.keys:
      raise ConfigError(f"{what}: its examples hold no numeric feature, got {sorted(first)}")

  def __len__(self) -> int:
    return len(self.source)

  def _rows(self, indices: list[int]) -> Rows:
    getitems = getattr(self.source, "__getitems__", None)
    examples = getitems(indices) if getitems is not None else [self.source[i] for i in indices]
    flat = [flatten(_as_dict(e, self.what)) for e in examples]
    return {k: np.stack([np.asarray(e[k]) for e in flat]) for k in flat[0]}

  def read(self, indices: np.ndarray) -> Rows:
    rows = self._rows([int(i) for i in indices])
    return {k: rows[k] for k in self.keys}

  def digest(self, h: "hashlib._Hash") -> None:
    own = source_identity.identity(self.source)
    h.update(f"\0{type(self.source).__qualname__}\0{len(self)}\0".encode())
    if own is not None:  # A Hugging Face fingerprint, the files' paths, sizes and times: every row counts.
      h.update(own.encode())
      return
    sample = np.unique(np.linspace(0, len(self) - 1, SAMPLE_ROWS).astype(np.int64))
    _digest_rows(h, self.read(sample))


def _digest_rows(h: "hashlib._Hash", rows: Rows) -> None:
  """Each feature's name, dtype, shape and bytes into `h`, in name order."""
  for k, v in sorted(rows.items()):
    h.update(f"\0{k}\0{v.dtype.str}\0{v.shape}\0".encode())
    h.update(np.ascontiguousarray(v).data)


def _numeric(dtype: np.dtype) -> bool:
  """Whether a feature of this dtype can be batched onto a device (numbers and booleans)."""
  return np.issubdtype(dtype, np.number) or np.issubdtype(dtype, np.bool_)


def _why(dtype: np.dtype) -> str:
  """Why a batch leaves out a feature of this (not numeric) dtype."""
  return f"{TEXT} (dtype {dtype})"


def _as_dict(example: Any, what: str) -> Mapping[str, Any]:
  if not isinstance(example, Mapping):
    raise ConfigError(f"{what}: an example must be a dict of arrays (feature name -> value), got "
                      f"{type(example).__name__}")
  return example


def open_data(config: ml_collections.ConfigDict, train_data: Any = None, eval_data: Any = None) -> Dataset:
  """The `Dataset` of in-memory splits: `train_data` as config.train_split, `eval_data` as config.eval_split."""
  given = [(split, data, what) for split, data, what in ((config.train_split, train_data, "train_data"),
                                                          (config.eval_split, eval_data, "eval_data")) if data is not None]
  if not given:
    raise ConfigError("in-memory data needs train_data or eval_data")
  if len(given) == 2 and config.train_split == config.eval_split:
    raise ConfigError(f"dataset.train_split and dataset.eval_split are both {config.train_split!r}: in-memory "
                      f"train_data and eval_data need two split names")
  return open_splits(config, {split: data for split, data, _ in given},
                     whats={split: f"{what} ({split!r})" for split, _, what in given})


def open_splits(config: ml_collections.ConfigDict, data: dict[str, Any], name: str = NAME, kind: str = KIND,
                whats: dict[str, str] | None = None) -> Dataset:
  """The `Dataset` of `data` (split -> a dict of arrays or a random-access source), named `name`@digest."""
  splits = {split: (ArraysSource if is_arrays(d) else RandomAccessSource)(d, (whats or {}).get(split, repr(split)))
            for split, d in data.items()}
  facts = _facts(splits, name)
  return Dataset(ArrayCorpus(facts, splits), Options.from_config(config, facts.input_shape), kind=kind)


def _facts(splits: dict[str, ArraysSource | RandomAccessSource], prefix: str) -> Facts:
  """The data's facts: its features (the splits must agree), its supervised pair when it has one, its digest."""
  h = hashlib.sha256()
  features = None
  for split, source in splits.items():
    probe = source.read(np.zeros([1], np.int64))
    these = {k: (tuple(v.shape[1:]), v.dtype) for k, v in probe.items()}
    if features is not None and these != features:
      raise ConfigError(f"the in-memory splits hold different features: {_named(features)} and, in {split!r}, "
                        f"{_named(these)}")
    features = these
    h.update(f"\0{split}\0".encode())
    source.digest(h)
  name = f"{prefix}@{h.hexdigest()[:12]}"
  left_out = {k: why for source in splits.values() for k, why in source.left_out.items()}
  if INPUTS not in features or LABELS not in features:
    return Facts(name, (), (), 0, features=features, left_out=left_out)
  (input_shape, inputs), (label_shape, labels) = features[INPUTS], features[LABELS]
  image = inputs == np.uint8 and len(input_shape) == 3
  integer = np.issubdtype(inputs, np.integer) and not image
  float_labels = bool(np.issubdtype(labels, np.floating))
  classes = 0 if float_labels else _num_classes(splits)
  return Facts(name, input_shape, label_shape, classes, integer, image, float_labels, features, left_out)


def _num_classes(splits: dict[str, ArraysSource | RandomAccessSource]) -> int:
  """The largest integer label of every split + 1 (labels only are read)."""
  top = -1
  for source in splits.values():
    if isinstance(source, ArraysSource):
      labels = source.arrays[LABELS]
      top = max(top, int(labels.max()) if labels.size else -1)
      continue
    for lo in range(0, len(source), _CHUNK):
      top = max(top, int(source.read(np.arange(lo, min(len(source), lo + _CHUNK)))[LABELS].max()))
  return top + 1


def _named(features: dict) -> str:
  return ", ".join(f"{k} {shape} {np.dtype(dtype)}" for k, (shape, dtype) in sorted(features.items()))
