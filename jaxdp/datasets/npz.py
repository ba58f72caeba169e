"""An `.npz` file of numpy arrays as a TFDS dataset, prepared once into ArrayRecord (offline). Every array is a
feature (one row per example: the arrays share their first dimension).

Layouts:
  - `NAME_train`, `NAME_test` pairs (`x_train`, `y_train`, `x_test`, `y_test`, as `keras.datasets` returns them,
    plus any others, e.g. `mask_train`, `mask_test`): the two splits, each pair one feature `NAME`;
  - arrays without a split suffix: one set, split deterministically: a fixed permutation (seed 0) puts
    `test_fraction` (default 0.1) of the examples into `test`, the rest into `train`.
`x`, `y` (or `inputs`, `labels`) are the supervised pair, batched as "inputs" and "labels" as for any supervised
dataset; every other array keeps its name; a file without that pair has no supervised keys (a task reads its
features by name). Inputs that are uint8 [N, H, W] or [N, H, W, C] with C in 1, 3, 4 become images (PNG-encoded,
so image preprocessing applies); any other array becomes a tensor of one row's shape (float64 stored as float32).
Labels that are integers >= 0 of one per example are classes (the number of classes is the largest label + 1);
any other labels (float, or several per example) are targets of their own shape and dtype.

    config.dataset.name = "/data/iris.npz"   # builder_kwargs: test_fraction
"""

import os
import zipfile
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds

from jaxdp.config import ConfigError
from jaxdp.data import tfds_dataset
from jaxdp.datasets import fingerprint

SPLIT_SEED = 0  # The deterministic split's permutation; changing it must bump VERSION.
SUPERVISED = (("x", "y"), ("inputs", "labels"))  # The supervised pair, the first present wins.
SPLITS = ("train", "test")


def make(name: str, data_dir: str | None, kwargs: dict, skip_bad: bool = False, **extra) -> tfds.core.DatasetBuilder:
  """The builder of the .npz file `name` (a `kinds` maker; a missing file is reported by name)."""
  del skip_bad  # Arrays have nothing to decode.
  return NpzFile(path=os.path.expanduser(name), **tfds_dataset.user_kwargs(data_dir, kwargs, extra))


def array_names(path: str) -> tuple[str, ...]:
  """The names of the arrays in the file, in its order."""
  try:
    with zipfile.ZipFile(path) as z:
      return tuple(n[:-4] for n in z.namelist() if n.endswith(".npy"))
  except (OSError, zipfile.BadZipFile) as e:
    raise ConfigError(f"cannot read .npz file {path!r}: {e}") from None


def layout(path: str) -> tuple[tuple[str, ...], bool]:
  """The file's features (each array, or each NAME_train/NAME_test pair, is one) and whether it holds both splits."""
  names = array_names(path)
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


def supervised_pair(features: tuple[str, ...]) -> tuple[str, str] | None:
  """The (inputs, labels) features of the file, or None when it has neither pair."""
  return next((pair for pair in SUPERVISED if set(pair) <= set(features)), None)


def read_splits(path: str, test_fraction: float) -> dict[str, dict[str, np.ndarray]]:
  """split -> {feature: array}: the file's two splits, or its one set split with the fixed permutation."""
  features, both = layout(path)
  with np.load(path, allow_pickle=False) as f:
    if both:
      return {s: {k: f[f"{k}_{s}"] for k in features} for s in SPLITS}
    arrays = {k: f[k] for k in features}
  order = np.random.RandomState(SPLIT_SEED).permutation(len(next(iter(arrays.values()))))
  n_test = int(round(len(order) * test_fraction))
  return {"train": {k: a[order[n_test:]] for k, a in arrays.items()},
          "test": {k: a[order[:n_test]] for k, a in arrays.items()}}


def array_header(path: str, name: str) -> tuple[tuple[int, ...], np.dtype]:
  """Shape and dtype of one array, read from its header only (the data stays on disk)."""
  with zipfile.ZipFile(path) as z, z.open(f"{name}.npy") as f:
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(f)
  return shape, dtype


def input_feature(shape: tuple[int, ...], dtype: np.dtype) -> tfds.features.FeatureConnector:
  """uint8 [N, H, W(, C)] -> Image; anything else -> Tensor of one example's shape."""
  if dtype == np.uint8 and (len(shape) == 3 or (len(shape) == 4 and shape[-1] in (1, 3, 4))):
    return tfds.features.Image(shape=tuple(shape[1:]) if len(shape) == 4 else (*shape[1:], 1))
  return tensor_feature(shape, dtype)


def tensor_feature(shape: tuple[int, ...], dtype: np.dtype) -> tfds.features.Tensor:
  """A Tensor of one row's shape (float64 stored as float32)."""
  return tfds.features.Tensor(shape=tuple(shape[1:]), dtype=np.float32 if dtype == np.float64 else dtype)


def is_classes(y: np.ndarray) -> bool:
  """Whether labels are classes: integers >= 0, one per example."""
  return y.ndim == 1 and np.issubdtype(y.dtype, np.integer) and not (len(y) and y.min() < 0)


class NpzFile(fingerprint.SourceBuilder, skip_registration=True):
  """The arrays of one `.npz` file; its prepared copy is named by the file's identity (see fingerprint)."""

  name = "npz_file"
  KIND = ".npz file"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "x_train/y_train/x_test/y_test, or x/y | inputs/labels split with seed 0; every other "
                            "array a feature (its config name then names the features)."}
  _exists = staticmethod(os.path.isfile)
  INPUT, LABEL = "inputs", "label"  # The builder's supervised features (a file's x/y or inputs/labels).

  def _open(self, path: str, test_fraction: float) -> list[str]:
    self._features, self._both = layout(path)
    self._pair = supervised_pair(self._features)
    self._num_classes = self._check(path, test_fraction)
    return [path]

  def _options(self) -> dict:
    """Beyond the held-out fraction: a file of more than the classic pair names its features, so that a copy
    prepared when jaxdp kept only x and y (or integer labels only) is never read as this one."""
    classic = self._pair is not None and len(self._features) == 2 and self._num_classes
    return {**super()._options(), **({} if classic else {"features": self._names()})}

  def _names(self) -> dict[str, str]:
    """The file's feature -> the builder's feature ("inputs", "label" for the supervised pair)."""
    supervised = dict(zip(self._pair, (self.INPUT, self.LABEL))) if self._pair else {}
    return {k: supervised.get(k, k) for k in self._features}

  def _arrays(self, split: str) -> dict[str, str]:
    """The builder's feature -> its array's name in the file, for one split."""
    return {name: f"{k}_{split}" if self._both else k for k, name in self._names().items()}

  def _check(self, path: str, test_fraction: float) -> int:
    """Checks that the arrays of a split share their first dimension (headers only; labels are read); returns the
    number of classes (0: the labels are targets, or there are none)."""
    if self._pair and (clash := sorted({self.INPUT, self.LABEL} & (set(self._features) - set(self._pair)))):
      raise ConfigError(f".npz file {path!r}: array {clash[0]!r} is also the name of its supervised pair "
                        f"{'/'.join(self._pair)}: rename one")
    for split in SPLITS if self._both else ("",):
      arrays = self._arrays(split)
      shapes = {k: array_header(path, k)[0] for k in arrays.values()}
      if any(len(s) < 1 for s in shapes.values()) or len({s[0] for s in shapes.values()}) != 1:
        raise ConfigError(f".npz file {path!r}: its arrays must be [N, ...] with one N per split, got "
                          + ", ".join(f"{k} {s}" for k, s in shapes.items()))
      if self._pair and len(shapes[arrays[self.INPUT]]) < 2:
        raise ConfigError(f".npz file {path!r}: inputs {arrays[self.INPUT]} {shapes[arrays[self.INPUT]]} must be "
                          f"[N, ...] with one or more values per example")
    n = array_header(path, f"{self._features[0]}_train" if self._both else self._features[0])[0][0]
    if not self._both and not 0 < int(round(n * test_fraction)) < n:
      raise ConfigError(f"test_fraction {test_fraction!r} of the {n} examples of {path!r} leaves a split empty")
    if not self._pair:
      return 0
    with np.load(path, allow_pickle=False) as f:
      labels = [f[self._arrays(s)[self.LABEL]] for s in (SPLITS if self._both else ("",))]
    for y, name in zip(labels, (self._arrays(s)[self.LABEL] for s in (SPLITS if self._both else ("",)))):
      if y.ndim == 1 and np.issubdtype(y.dtype, np.integer) and len(y) and y.min() < 0:
        raise ConfigError(f".npz file {path!r}: labels {name} are integers, so classes, and must be >= 0 (float "
                          f"labels are targets)")
    if not all(is_classes(y) for y in labels):
      return 0  # Targets (float, or several per example): a regression, say, not classes.
    return max((int(y.max()) for y in labels if len(y)), default=0) + 1

  def _info(self) -> tfds.core.DatasetInfo:
    path, split = self.builder_config.path, "train" if self._both else ""
    features = {}
    for name, array in self._arrays(split).items():
      shape, dtype = array_header(path, array)
      if name == self.INPUT and self._pair:
        features[name] = input_feature(shape, dtype)
      elif name == self.LABEL and self._pair and self._num_classes:
        features[name] = tfds.features.ClassLabel(num_classes=self._num_classes)
      else:
        features[name] = tensor_feature(shape, dtype)
    return tfds.core.DatasetInfo(
        builder=self,
        description=f"Arrays of the .npz file {path}.",
        features=tfds.features.FeaturesDict(features),
        supervised_keys=(self.INPUT, self.LABEL) if self._pair else None,
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
    del dl_manager  # A local file.
    splits = read_splits(self.builder_config.path, self.builder_config.test_fraction)
    names = self._names()
    return {split: self._generate_examples({names[k]: a for k, a in arrays.items()}) for split, arrays in splits.items()}

  def _generate_examples(self, arrays: dict[str, np.ndarray]) -> Iterator[tuple[int, dict]]:
    features = self.info.features
    for i in range(len(next(iter(arrays.values())))):
      example = {}
      for name, a in arrays.items():
        feature = features[name]
        if isinstance(feature, tfds.features.Image):
          example[name] = a[i] if a.ndim == 4 else a[i][..., None]
        elif isinstance(feature, tfds.features.ClassLabel):
          example[name] = int(a[i])
        else:
          example[name] = np.asarray(a[i]).astype(feature.np_dtype)
      yield i, example
