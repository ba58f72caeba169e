"""`bad_datasets:BadJpegs`: the image tests' varsize JPEGs with some examples cut in half, stored as they are, so that
only decoding them in training or eval finds them (as a TFDS dataset's bad bytes would be)."""

import tensorflow_datasets as tfds

import jpeg_dataset
from jaxdp.datasets import synthetic_images


class BadJpegs(jpeg_dataset.VarsizeJpegs, skip_registration=True):
  """64 train and 20 test JPEGs; the train examples `bad_train` and test examples `bad_test` are truncated."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, bad_train: tuple[int, ...] = (), bad_test: tuple[int, ...] = (), **kwargs):
    self.bad = {0: set(bad_train), synthetic_images.TEST_OFFSET: set(bad_test)}
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
