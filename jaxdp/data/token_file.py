"""A token file as a dataset: one flat uint16 or uint32 file of token ids (as nanoGPT's `train.bin`), read by index.

The file is memory-mapped and read as windows of seq_len + 1 tokens by global index: window i starts at
token i * stride, `inputs` are its first seq_len tokens and `labels` the next tokens (a shift by one).
Only the pages of the windows read are touched: memory does not grow with the file.

A sidecar `PATH.json` ({"dtype", "vocab_size", "num_tokens"}), written by `jaxdp.datasets.token_file.Writer`,
gives the dtype and vocabulary; a file without one (nanoGPT's) needs `vocab_size` (and `dtype` unless uint16).

Splits (`splits(...)`): `train` and `test`, either two files (`path` and `eval_path`, like nanoGPT's
train.bin / val.bin) or one file cut by `test_fraction` (the last fraction of its tokens is `test`).
Train windows start every `stride` tokens (default seq_len); eval windows every seq_len, so each eval
target is counted once. `dataset.name = "token_file"` opens one (`open_dataset`, registered in `kinds`).
"""

import hashlib
import json
import os

import ml_collections
import numpy as np

from jaxdp.config import ConfigError
from jaxdp.data.dataset import Dataset, Options
from jaxdp.data.source import ArrayCorpus, Facts

NAME = "token_file"  # The `dataset.name` of a token file.
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def sidecar_path(path: str) -> str:
  """The sidecar JSON of a token file."""
  return path + ".json"


def read_meta(path: str) -> dict:
  """The sidecar's fields, or {} when the file has none."""
  if not os.path.exists(sidecar_path(path)):
    return {}
  with open(sidecar_path(path)) as f:
    return json.load(f)


class TokenWindows:
  """Windows of seq_len + 1 tokens over tokens [start, stop) of a memory-mapped token file."""

  def __init__(self, path: str, seq_len: int, dtype: str | None = None, stride: int | None = None,
               vocab_size: int | None = None, start: int = 0, stop: int | None = None):
    if not os.path.isfile(path):
      raise ConfigError(f"token file {path!r} not found")
    if not (isinstance(seq_len, int) and seq_len > 0):
      raise ConfigError(f"dataset seq_len must be a positive integer, got {seq_len!r}")
    if not (stride is None or (isinstance(stride, int) and stride >= 0)):
      raise ConfigError(f"dataset stride must be a non-negative integer, got {stride!r}")
    meta = read_meta(path)
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

  @property
  def input_shape(self) -> tuple[int, ...]:
    return (self.seq_len,)

  @property
  def num_classes(self) -> int:
    return self.vocab_size

  @property
  def integer_inputs(self) -> bool:
    return True

  def spec(self) -> dict:
    """What decides the examples (for a resume guard): the file's identity and the windowing."""
    st = os.stat(self.path)
    return {"path": self.path, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "dtype": self.dtype,
            "seq_len": self.seq_len, "stride": self.stride, "start": self.start, "stop": self.stop}


def _check_against_sidecar(path: str, meta: dict, dtype: str | None, vocab_size: int | None) -> None:
  """A dtype or vocabulary given in the config must not contradict the file's sidecar: other bytes per token
  read as garbage ids, and ids past the model's vocabulary embed as NaN (every such step skipped), not refused."""
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
    if not (isinstance(test_fraction, (int, float)) and 0 < test_fraction < 1):
      raise ConfigError(f"dataset test_fraction must be in (0, 1), got {test_fraction!r}")
    n = len(TokenWindows(path, **common).tokens)
    cut = n - int(round(n * test_fraction))
    train = TokenWindows(path, stride=stride, stop=cut, **common)
    test = TokenWindows(path, start=cut, **common)
  for name, windows in (("train", train), ("test", test)):
    if not len(windows):
      raise ConfigError(f"split {name!r} of token file {windows.path!r} has {windows.stop - windows.start} "
                        f"tokens, fewer than seq_len + 1 ({seq_len + 1})")
  return {"train": train, "test": test}


def open_dataset(config: ml_collections.ConfigDict, kwargs: dict) -> Dataset:
  """A token file's `Dataset` (`kwargs`: `splits`' arguments): windows read by index, nothing to decode."""
  windows = splits(**kwargs)
  train = windows["train"]
  digest = hashlib.sha256(json.dumps({k: s.spec() for k, s in windows.items()}, sort_keys=True).encode())
  facts = Facts(f"{NAME}:{os.path.basename(train.path)}@{digest.hexdigest()[:12]}", train.input_shape,
                train.input_shape, train.num_classes, integer_inputs=True)
  return Dataset(ArrayCorpus(facts, windows), Options.from_config(config, facts.input_shape), kind=NAME)
