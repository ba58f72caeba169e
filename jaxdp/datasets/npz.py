"""An `.npz` file of numpy arrays as a TFDS dataset, prepared once into ArrayRecord (offline).

Array names (the first set present wins):
  - `x_train`, `y_train`, `x_test`, `y_test` (as `keras.datasets` returns them): the two splits;
  - `x`, `y` or `inputs`, `labels`: one set, split deterministically: a fixed permutation (seed 0)
    puts `test_fraction` (default 0.1) of the examples into `test`, the rest into `train`.
Inputs that are uint8 [N, H, W] or [N, H, W, C] with C in 1, 3, 4 become images (PNG-encoded, so image
preprocessing applies); any other inputs become tensors (float64 stored as float32). Labels must be
integers >= 0; the number of classes is the largest label + 1.

    config.dataset.name = "/data/iris.npz"   # builder_kwargs: test_fraction
"""

import os
import zipfile
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds

from jaxdp.config import ConfigError
from jaxdp.datasets import fingerprint

SPLIT_SEED = 0  # The deterministic split's permutation; changing it must bump VERSION.
NAME_SETS = (("x_train", "y_train", "x_test", "y_test"), ("x", "y"), ("inputs", "labels"))


def array_names(path: str) -> tuple[str, ...]:
  """The names of the input/label arrays in the file: (x, y) or (x_train, y_train, x_test, y_test)."""
  try:
    with zipfile.ZipFile(path) as z:
      names = {n[:-4] for n in z.namelist() if n.endswith(".npy")}
  except (OSError, zipfile.BadZipFile) as e:
    raise ConfigError(f"cannot read .npz file {path!r}: {e}") from None
  found = next((s for s in NAME_SETS if set(s) <= names), None)
  if found is None:
    raise ConfigError(f".npz file {path!r} has arrays {sorted(names)}; expected x/y, inputs/labels or "
                      f"x_train/y_train/x_test/y_test")
  return found


def array_header(path: str, name: str) -> tuple[tuple[int, ...], np.dtype]:
  """Shape and dtype of one array, read from its header only (the data stays on disk)."""
  with zipfile.ZipFile(path) as z, z.open(f"{name}.npy") as f:
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(f)
  return shape, dtype


def read_splits(path: str, test_fraction: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """split -> (inputs, labels): the file's two splits, or its one set split with the fixed permutation."""
  names = array_names(path)
  with np.load(path, allow_pickle=False) as f:
    arrays = [f[k] for k in names]
  if len(arrays) == 4:
    return {"train": (arrays[0], arrays[1]), "test": (arrays[2], arrays[3])}
  x, y = arrays
  order = np.random.RandomState(SPLIT_SEED).permutation(len(x))
  n_test = int(round(len(x) * test_fraction))
  return {"train": (x[order[n_test:]], y[order[n_test:]]), "test": (x[order[:n_test]], y[order[:n_test]])}


def input_feature(shape: tuple[int, ...], dtype: np.dtype) -> tfds.features.FeatureConnector:
  """uint8 [N, H, W(, C)] -> Image; anything else -> Tensor of one example's shape."""
  if dtype == np.uint8 and (len(shape) == 3 or (len(shape) == 4 and shape[-1] in (1, 3, 4))):
    return tfds.features.Image(shape=tuple(shape[1:]) if len(shape) == 4 else (*shape[1:], 1))
  return tfds.features.Tensor(shape=tuple(shape[1:]), dtype=np.float32 if dtype == np.float64 else dtype)


class NpzFile(fingerprint.SourceBuilder, skip_registration=True):
  """The arrays of one `.npz` file; its prepared copy is named by the file's identity (see fingerprint)."""

  name = "npz_file"
  KIND = ".npz file"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "x_train/y_train/x_test/y_test, or x/y | inputs/labels split with seed 0."}
  _exists = staticmethod(os.path.isfile)

  def _open(self, path: str, test_fraction: float) -> list[str]:
    self._names = array_names(path)
    self._num_classes = self._check(path, test_fraction)
    return [path]

  def _check(self, path: str, test_fraction: float) -> int:
    """Checks shapes and labels (labels are read, inputs only by header); returns the number of classes."""
    with np.load(path, allow_pickle=False) as f:
      labels = {name: f[name] for name in self._names[1::2]}
    for x_name, y_name in zip(self._names[::2], self._names[1::2]):
      shape, y = array_header(path, x_name)[0], labels[y_name]
      if len(shape) < 2 or y.ndim != 1 or shape[0] != len(y):
        raise ConfigError(f".npz file {path!r}: inputs {x_name} {shape} and labels {y_name} {y.shape} must be "
                          f"[N, ...] and [N]")
      if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
        raise ConfigError(f".npz file {path!r}: labels {y_name} must be integers >= 0, got dtype {y.dtype}")
    if len(self._names) == 2:
      n = len(labels[self._names[1]])
      if not 0 < int(round(n * test_fraction)) < n:
        raise ConfigError(f"test_fraction {test_fraction!r} of the {n} examples of {path!r} leaves a split empty")
    return max(int(y.max()) for y in labels.values() if len(y)) + 1

  def _info(self) -> tfds.core.DatasetInfo:
    shape, dtype = array_header(self.builder_config.path, self._names[0])
    return tfds.core.DatasetInfo(
        builder=self,
        description=f"Arrays of the .npz file {self.builder_config.path}.",
        features=tfds.features.FeaturesDict({
            "inputs": input_feature(shape, dtype),
            "label": tfds.features.ClassLabel(num_classes=self._num_classes),
        }),
        supervised_keys=("inputs", "label"),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
    del dl_manager  # A local file.
    splits = read_splits(self.builder_config.path, self.builder_config.test_fraction)
    return {split: self._generate_examples(x, y) for split, (x, y) in splits.items()}

  def _generate_examples(self, x: np.ndarray, y: np.ndarray) -> Iterator[tuple[int, dict]]:
    feature = self.info.features["inputs"]
    for i in range(len(x)):
      if isinstance(feature, tfds.features.Image):
        xi = x[i] if x.ndim == 4 else x[i][..., None]
      else:
        xi = x[i].astype(feature.np_dtype)
      yield i, {"inputs": xi, "label": int(y[i])}
