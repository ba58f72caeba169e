"""`digits`: scikit-learn's bundled handwritten digits (1797 real 8x8 images) as a TFDS dataset, offline."""

from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds

NUM_TEST = 360  # Fixed held-out split: 1437 train, 360 test examples.
SPLIT_SEED = 0  # The split is a fixed permutation; changing it must bump VERSION.


class Digits(tfds.core.GeneratorBasedBuilder):
  """8x8 grayscale digits 0-9, pixel values scaled from 0..16 to 0..255."""

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.0.0": "1437 train / 360 test, fixed permutation with seed 0.",
                   "1.1.0": "Prepared as ArrayRecord (random access); same examples."}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description="scikit-learn's optical recognition of handwritten digits (UCI), 8x8 pixels.",
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(8, 8, 1)),
            "label": tfds.features.ClassLabel(num_classes=10),
        }),
        supervised_keys=("image", "label"),
        homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html#digits-dataset",
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
    del dl_manager  # Nothing to download: the data ships with scikit-learn.
    from sklearn.datasets import load_digits  # Imported here: only preparing needs scikit-learn.
    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)[..., None]
    order = np.random.RandomState(SPLIT_SEED).permutation(len(images))
    test, train = order[:NUM_TEST], order[NUM_TEST:]
    return {
        "train": self._generate_examples(images[train], digits.target[train]),
        "test": self._generate_examples(images[test], digits.target[test]),
    }

  def _generate_examples(self, images: np.ndarray, labels: np.ndarray) -> Iterator[tuple[int, dict]]:
    for i, (image, label) in enumerate(zip(images, labels)):
      yield i, {"image": image, "label": int(label)}
