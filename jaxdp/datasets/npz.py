"""An `.npz` file of numpy arrays as in-memory splits (`jaxdp.data.arrays`); its layouts: docs/data.md (.npz files)."""

import os
import zipfile

import ml_collections
import numpy as np

from jaxdp.config import ConfigError
from jaxdp.data import arrays
from jaxdp.data.dataset import Dataset
from jaxdp.data.source import INPUTS, LABELS
from jaxdp.datasets import fingerprint

SPLIT_SEED = 0  # The deterministic split's permutation.
SUPERVISED = (("x", "y"), ("inputs", "labels"))  # The supervised pair, the first present wins.
SPLITS = ("train", "test")
KIND = ".npz file"


def open_dataset(config: ml_collections.ConfigDict, kwargs: dict) -> Dataset:
  """The `.npz` file `config.name` as in-memory splits "train" and "test" (`builder_kwargs`: test_fraction)."""
  unknown = sorted(set(kwargs) - {"test_fraction"})
  if unknown:
    raise ConfigError(f"dataset.builder_kwargs {unknown} do not apply to an .npz file (only test_fraction)")
  test_fraction = kwargs.get("test_fraction", 0.1)
  path = fingerprint.checked_source(os.path.expanduser(config.name), test_fraction, KIND, os.path.isfile)
  return arrays.open_splits(config, read_splits(path, test_fraction), os.path.basename(path), kind="npz")


def layout(path: str) -> tuple[tuple[str, ...], bool]:
  """The file's features (each array, or each NAME_train/NAME_test pair, is one) and whether it holds both splits."""
  try:
    with zipfile.ZipFile(path) as z:
      names = tuple(n[:-4] for n in z.namelist() if n.endswith(".npy"))
  except (OSError, zipfile.BadZipFile) as e:
    raise ConfigError(f"cannot read .npz file {path!r}: {e}") from None
  if not names:
    raise ConfigError(f".npz file {path!r} holds no arrays")
  suffixed = [n for n in names if n.endswith(tuple(f"_{s}" for s in SPLITS))]
  if not suffixed:
    return names, False
  features = tuple(dict.fromkeys(n.rsplit("_", 1)[0] for n in suffixed))
  missing = sorted({f"{f}_{s}" for f in features for s in SPLITS} - set(names))
  if missing or len(suffixed) != len(names):
    raise ConfigError(f".npz file {path!r} has arrays {sorted(names)}: with a NAME_train/NAME_test layout every "
                      f"array needs its pair and a split suffix (missing: {', '.join(missing) or 'none'}; without a "
                      f"suffix: {', '.join(sorted(set(names) - set(suffixed))) or 'none'})")
  return features, True


def read_splits(path: str, test_fraction: float) -> dict[str, dict[str, np.ndarray]]:
  """split -> {batch name: array}: the file's two splits, or its one set split with the fixed permutation."""
  features, both = layout(path)
  names = _batch_names(path, features)
  with np.load(path, allow_pickle=False) as f:
    raw = {s: {k: f[f"{k}_{s}" if both else k] for k in features} for s in (SPLITS if both else ("",))}
  for split, columns in raw.items():
    _check_rows(path, split, columns, names)
  if both:
    splits = raw
  else:
    columns = raw[""]
    n = len(next(iter(columns.values())))
    n_test = int(round(n * test_fraction))
    if not 0 < n_test < n:
      raise ConfigError(f"test_fraction {test_fraction!r} of the {n} examples of {path!r} leaves a split empty")
    order = np.random.RandomState(SPLIT_SEED).permutation(n)
    splits = {"train": {k: a[order[n_test:]] for k, a in columns.items()},
              "test": {k: a[order[:n_test]] for k, a in columns.items()}}
  return {s: {names[k]: _as_batched(names[k], a) for k, a in columns.items()} for s, columns in splits.items()}


def _batch_names(path: str, features: tuple[str, ...]) -> dict[str, str]:
  """The file's feature -> its batch name ("inputs", "labels" for the supervised pair)."""
  pair = next((p for p in SUPERVISED if set(p) <= set(features)), None)
  if pair is None:
    return {k: k for k in features}
  if clash := sorted({INPUTS, LABELS} & (set(features) - set(pair))):
    raise ConfigError(f".npz file {path!r}: array {clash[0]!r} is also the name of its supervised pair "
                      f"{'/'.join(pair)}: rename one")
  return {k: dict(zip(pair, (INPUTS, LABELS))).get(k, k) for k in features}


def _check_rows(path: str, split: str, arrays: dict[str, np.ndarray], names: dict[str, str]) -> None:
  """The arrays of a split share their first dimension; inputs hold values; integer class labels are >= 0."""
  suffix = f"_{split}" if split else ""
  if any(a.ndim < 1 for a in arrays.values()) or len({a.shape[0] for a in arrays.values()}) != 1:
    raise ConfigError(f".npz file {path!r}: its arrays must be [N, ...] with one N per split, got "
                      + ", ".join(f"{k}{suffix} {a.shape}" for k, a in arrays.items()))
  by_name = {names[k]: (f"{k}{suffix}", a) for k, a in arrays.items()}
  if INPUTS in by_name and by_name[INPUTS][1].ndim < 2:
    raise ConfigError(f".npz file {path!r}: inputs {by_name[INPUTS][0]} {by_name[INPUTS][1].shape} must be "
                      f"[N, ...] with one or more values per example")
  if LABELS in by_name:
    name, y = by_name[LABELS]
    if np.issubdtype(y.dtype, np.integer) and y.size and y.min() < 0:
      raise ConfigError(f".npz file {path!r}: labels {name} are integers, so classes, and must be >= 0 (float "
                        f"labels are targets)")


def _as_batched(name: str, a: np.ndarray) -> np.ndarray:
  """An array as batches hold it: float64 as float32, uint8 [N, H, W] images with one channel."""
  if a.dtype == np.float64:
    return a.astype(np.float32)
  if name == INPUTS and a.dtype == np.uint8 and a.ndim == 3:
    return a[..., None]
  return a
