"""`bad_datasets:BadJpegs` (the image tests' varsize JPEGs) and `BadPngs` (of fixed size) with some examples cut in
half, stored as they are, so that only decoding them in training or eval finds them (as a TFDS dataset's bad bytes
would be)."""

import io

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

import jpeg_dataset
from jaxdp.datasets import synthetic_jpegs


class BadJpegs(jpeg_dataset.VarsizeJpegs, skip_registration=True):
  """64 train and 20 test JPEGs; the train examples `bad_train` and test examples `bad_test` are truncated."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, bad_train: tuple[int, ...] = (), bad_test: tuple[int, ...] = (), **kwargs):
    self.bad = {0: set(bad_train), synthetic_jpegs.TEST_OFFSET: set(bad_test)}
    super().__init__(**kwargs)  # Give each choice of bad examples its own data_dir: the name does not hold it.

  def _generate_examples(self, first: int, n: int):
    for key, example in super()._generate_examples(first, n):
      if key - first in self.bad[first]:
        example = {**example, "image": example["image"][:len(example["image"]) // 2]}
      yield key, example


class BadTrainJpegs(BadJpegs, skip_registration=True):
  """BadJpegs with train example 5 truncated, for the command line (which cannot add builder_kwargs)."""

  def __init__(self, **kwargs):
    super().__init__(bad_train=(5,), **kwargs)


def png(index: int) -> bytes:
  """An 8x8 RGB PNG, a function of `index`."""
  out = io.BytesIO()
  Image.fromarray(np.random.RandomState(index).randint(0, 256, (8, 8, 3), np.uint8)).save(out, "PNG")
  return out.getvalue()


class BadPngs(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """64 train and 20 test 8x8 PNGs (fixed size: small splits are decoded once, in memory, `dataset.cache_mb`);
  the train examples `bad_train` and test examples `bad_test` are cut in half, so that only decoding finds them."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, bad_train: tuple[int, ...] = (), bad_test: tuple[int, ...] = (), **kwargs):
    self.bad = {"train": set(bad_train), "test": set(bad_test)}
    super().__init__(**kwargs)  # Give each choice of bad examples its own data_dir: the name does not hold it.

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(8, 8, 3), encoding_format="png"),
        "label": tfds.features.ClassLabel(num_classes=4)}), supervised_keys=("image", "label"))

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
    del dl_manager
    return {"train": self._generate_examples("train", 0, 64), "test": self._generate_examples("test", 1000, 20)}

  def _generate_examples(self, split: str, first: int, n: int):
    for i in range(n):
      image = png(first + i)
      yield i, {"image": image[:len(image) // 2] if i in self.bad[split] else image, "label": i % 4}


class BadTrainPngs(BadPngs, skip_registration=True):
  """BadPngs with train example 5 truncated, for the command line (which cannot add builder_kwargs)."""

  def __init__(self, **kwargs):
    super().__init__(bad_train=(5,), **kwargs)

