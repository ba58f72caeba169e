"""A dataset a user brings as a TFDS builder class, named by "user_datasets:TinyBlobs" (not registered by jaxdp)."""

from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds


class TinyBlobs(tfds.core.GeneratorBasedBuilder):
  """Three Gaussian blobs in 8 dimensions: 96 train, 24 test examples."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, spread: float = 0.5, **kwargs):
    self.spread = spread
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            "x": tfds.features.Tensor(shape=(8,), dtype=np.float32),
            "y": tfds.features.ClassLabel(num_classes=3),
        }),
        supervised_keys=("x", "y"),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
    del dl_manager
    return {"train": self._generate_examples(96, 0), "test": self._generate_examples(24, 1)}

  def _generate_examples(self, n: int, seed: int) -> Iterator[tuple[int, dict]]:
    rng = np.random.RandomState(seed)
    centers = np.random.RandomState(42).randn(3, 8) * 3
    for i in range(n):
      y = i % 3
      yield i, {"x": (centers[y] + self.spread * rng.randn(8)).astype(np.float32), "y": y}


class NotABuilder:
  """A class that is not a TFDS builder: naming it must be a config error."""


class FloatLabels(TinyBlobs):
  """TinyBlobs with a float target in place of its class: a regression dataset (labels 0, 0.5, 1)."""

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({"x": tfds.features.Tensor(shape=(8,), dtype=np.float32),
                                             "y": tfds.features.Tensor(shape=(), dtype=np.float32)}),
        supervised_keys=("x", "y"),
    )

  def _generate_examples(self, n: int, seed: int) -> Iterator[tuple[int, dict]]:
    for i, example in super()._generate_examples(n, seed):
      yield i, {**example, "y": np.float32(example["y"]) / 2}


class NoExamples(tfds.core.GeneratorBasedBuilder):
  """A builder that forgot `_generate_examples`: naming it must say what is missing."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self) -> tfds.core.DatasetInfo:
    return TinyBlobs._info(self)

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
    return {}
