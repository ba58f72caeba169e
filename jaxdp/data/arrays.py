"""Splits that read final arrays (nothing to decode): in-memory arrays, random-access sources, token files."""

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np

from jaxdp.config import ConfigError
from jaxdp.data.dataset import Dataset, Options
from jaxdp.data.source import LABELS, TEXT, ArrayCorpus, Facts, Rows, facts_from, flatten, identity

NAME = "<in-memory>"  # The dataset's name before its digest: a checkpoint of other data is refused on resume.
KIND = "in-memory"     # Its source kind in the stream spec.
SAMPLE_ROWS = 64       # Rows of a source without a fingerprint that its digest reads.
_CHUNK = 1024          # Rows per read while counting a source's classes.
TOKEN_FILE = "token_file"  # The `dataset.name` (and source kind) of a token file.
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


class ArraysSource:
  """A split held as a dict of numpy arrays (flattened with "/"), all of one leading length."""

  def __init__(self, arrays: Mapping[str, Any], what: str):
    flat = {k: np.asarray(v) for k, v in flatten(arrays).items()}
    self.arrays = {k: v for k, v in flat.items() if _numeric(v.dtype)}
    self.left_out = {k: f"{TEXT} (dtype {v.dtype})" for k, v in flat.items() if k not in self.arrays}
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
  """A split that is a random-access source of example dicts (`len()`, `__getitem__`, optionally `__getitems__`)."""

  def __init__(self, source: Any, what: str):
    if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
      raise ConfigError(f"{what} must be a dict of numpy arrays or a random-access source (len() and "
                        f"__getitem__(i) -> dict of arrays), got {type(source).__name__}")
    self.source, self.what = source, what
    if not len(source):
      raise ConfigError(f"{what} has no examples")
    first = self._rows([0])
    self.keys = tuple(k for k, v in first.items() if _numeric(v.dtype))
    self.left_out = {k: f"{TEXT} (dtype {v.dtype})" for k, v in first.items() if k not in self.keys}
    if not self.keys:
      raise ConfigError(f"{what}: its examples hold no numeric feature, got {sorted(first)}")

  def __len__(self) -> int:
    return len(self.source)

  def _rows(self, indices: list[int]) -> Rows:
    getitems = getattr(self.source, "__getitems__", None)
    examples = getitems(indices) if getitems is not None else [self.source[i] for i in indices]
    if not all(isinstance(e, Mapping) for e in examples):
      raise ConfigError(f"{self.what}: an example must be a dict of arrays (feature name -> value), got "
                        f"{type(examples[0]).__name__}")
    flat = [flatten(e) for e in examples]
    return {k: np.stack([np.asarray(e[k]) for e in flat]) for k in flat[0]}

  def read(self, indices: np.ndarray) -> Rows:
    rows = self._rows([int(i) for i in indices])
    return {k: rows[k] for k in self.keys}

  def digest(self, h: "hashlib._Hash") -> None:
    own = identity(self.source)
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
  splits = {split: (ArraysSource if isinstance(d, Mapping) else RandomAccessSource)(d, (whats or {}).get(split, repr(split)))
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
  left_out = {k: why for source in splits.values() for k, why in source.left_out.items()}
  return facts_from(f"{prefix}@{h.hexdigest()[:12]}", features, left_out, lambda: _num_classes(splits))


def _num_classes(splits: dict[str, ArraysSource | RandomAccessSource]) -> int:
  """The largest integer label of every split + 1 (of arrays, the labels only; of a source, a chunk at a time)."""
  top = -1
  for source in splits.values():
    parts = [source.arrays[LABELS]] if isinstance(source, ArraysSource) else (
        source.read(np.arange(lo, min(len(source), lo + _CHUNK)))[LABELS] for lo in range(0, len(source), _CHUNK))
    top = max([top, *(int(p.max()) for p in parts if p.size)])
  return top + 1


def _named(features: dict) -> str:
  """Features as "name shape dtype", for messages."""
  return ", ".join(f"{k} {shape} {np.dtype(dtype)}" for k, (shape, dtype) in sorted(features.items()))


def sidecar_path(path: str) -> str:
  """The sidecar JSON of a token file."""
  return path + ".json"


class TokenWindows:
  """Windows of seq_len + 1 tokens over tokens [start, stop) of a memory-mapped token file."""

  def __init__(self, path: str, seq_len: int, dtype: str | None = None, stride: int | None = None,
               vocab_size: int | None = None, start: int = 0, stop: int | None = None):
    if not os.path.isfile(path):
      raise ConfigError(f"token file {path!r} not found")
    check_windows(seq_len, stride or 0)
    meta = {}
    if os.path.exists(sidecar_path(path)):
      with open(sidecar_path(path)) as f:
        meta = json.load(f)
    _check_against_sidecar(path, meta, dtype, vocab_size)
    dtype = dtype or meta.get("dtype", "uint16")
    if dtype not in DTYPES:
      raise ConfigError(f"token file dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    self.vocab_size = vocab_size or meta.get("vocab_size")  # Larger than the sidecar's: padded, as nanoGPT's 50304.
    if not (isinstance(self.vocab_size, int) and self.vocab_size > 0):
      raise ConfigError(f"token file {path!r} has no sidecar {sidecar_path(path)!r} giving its vocabulary: set "
                        f"dataset.builder_kwargs.vocab_size (and dtype, if not uint16)")
    size = os.path.getsize(path)
    if size % np.dtype(dtype).itemsize:
      raise ConfigError(f"token file {path!r} has {size} bytes, not a whole number of {dtype} tokens")
    self.path, self.dtype, self.seq_len, self.stride = os.path.abspath(path), dtype, seq_len, stride or seq_len
    self.tokens = np.memmap(path, dtype=DTYPES[dtype], mode="r")  # Pages are read on access only.
    self.start, self.stop = start, len(self.tokens) if stop is None else stop
    self._len = max(0, (self.stop - self.start - seq_len - 1) // self.stride + 1)

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return {k: v[0] for k, v in self.read(np.asarray([index])).items()}

  def read(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    """The windows at `indices`: {"inputs", "labels"}, each int32 [n, seq_len]."""
    indices = np.asarray(indices, np.int64)
    if indices.size and (indices.min() < 0 or indices.max() >= self._len):
      raise IndexError(f"window index out of range [0, {self._len}): {indices.min()}..{indices.max()}")
    offsets = (self.start + indices * self.stride)[:, None] + np.arange(self.seq_len + 1)
    windows = self.tokens[offsets].astype(np.int32)  # Reads only these windows' pages.
    return {"inputs": windows[:, :-1], "labels": windows[:, 1:]}

  def spec(self) -> dict:
    """What decides the examples (for a resume guard): the file's identity and the windowing."""
    st = os.stat(self.path)
    return {"path": self.path, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "dtype": self.dtype,
            "seq_len": self.seq_len, "stride": self.stride, "start": self.start, "stop": self.stop}


def check_windows(seq_len: int, stride: int) -> None:
  """Raises unless `seq_len` is a positive integer and `stride` a non-negative one (0: seq_len)."""
  if not (isinstance(seq_len, int) and seq_len > 0):
    raise ConfigError(f"dataset seq_len must be a positive integer, got {seq_len!r}")
  if not (isinstance(stride, int) and stride >= 0):
    raise ConfigError(f"dataset stride must be a non-negative integer, got {stride!r}")


def check_fraction(test_fraction: float) -> None:
  """Raises unless `test_fraction`, the share of a source held out for `test`, is in (0, 1)."""
  if isinstance(test_fraction, bool) or not (isinstance(test_fraction, (int, float)) and 0 < test_fraction < 1):
    raise ConfigError(f"dataset test_fraction must be in (0, 1), got {test_fraction!r}")


def _check_against_sidecar(path: str, meta: dict, dtype: str | None, vocab_size: int | None) -> None:
  """Raises if the config's dtype or vocabulary contradicts the file's sidecar."""
  # Other bytes per token read as garbage ids; ids past the model's vocabulary embed as NaN (each step skipped).
  if dtype and meta.get("dtype") and dtype != meta["dtype"]:
    raise ConfigError(f"token file {path!r} holds {meta['dtype']} tokens (its sidecar {sidecar_path(path)!r}), "
                      f"not dataset dtype {dtype!r}")
  if vocab_size and meta.get("vocab_size") and vocab_size < meta["vocab_size"]:
    raise ConfigError(f"dataset vocab_size {vocab_size} is smaller than token file {path!r}'s vocabulary "
                      f"({meta['vocab_size']}, its sidecar {sidecar_path(path)!r})")


def splits(path: str | None = None, seq_len: int = 128, stride: int = 0, eval_path: str | None = None,
           test_fraction: float = 0.1, dtype: str | None = None,
           vocab_size: int | None = None) -> dict[str, TokenWindows]:
  """`train` and `test` windows: two files, or one file cut by test_fraction (its last tokens are `test`)."""
  if not path:
    raise ConfigError("dataset 'token_file' needs a path: set config.dataset.builder_kwargs.path")
  common = dict(seq_len=seq_len, dtype=dtype, vocab_size=vocab_size)
  if eval_path:
    train, test = TokenWindows(path, stride=stride, **common), TokenWindows(eval_path, **common)
    if test.vocab_size != train.vocab_size:
      raise ConfigError(f"token files {path!r} and {eval_path!r} have different vocabularies "
                        f"({train.vocab_size}, {test.vocab_size})")
  else:
    check_fraction(test_fraction)
    n = len(TokenWindows(path, **common).tokens)
    cut = n - int(round(n * test_fraction))
    train = TokenWindows(path, stride=stride, stop=cut, **common)
    test = TokenWindows(path, start=cut, **common)
  for name, windows in (("train", train), ("test", test)):
    if not len(windows):
      raise ConfigError(f"split {name!r} of token file {windows.path!r} has {windows.stop - windows.start} "
                        f"tokens, fewer than seq_len + 1 ({seq_len + 1})")
  return {"train": train, "test": test}


def open_token_file(config: ml_collections.ConfigDict, kwargs: dict) -> Dataset:
  """A token file's `Dataset` (`kwargs`: `splits`' arguments): windows read by index, nothing to decode."""
  windows = splits(**kwargs)
  train = windows["train"]
  digest = hashlib.sha256(json.dumps({k: s.spec() for k, s in windows.items()}, sort_keys=True).encode())
  shape = (train.seq_len,)
  facts = Facts(f"{TOKEN_FILE}:{os.path.basename(train.path)}@{digest.hexdigest()[:12]}", shape, shape,
                train.vocab_size, integer_inputs=True)
  return Dataset(ArrayCorpus(facts, windows), Options.from_config(config, facts.input_shape), kind=TOKEN_FILE)
