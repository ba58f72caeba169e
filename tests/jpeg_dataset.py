"""`varsize_jpegs`: a tiny generated dataset of JPEGs of varying size (4 classes), prepared offline as ArrayRecord.

Each image is a smooth colour field whose hue is its class, so a model can learn it in a few steps;
heights and widths vary from 24 to 64 pixels. Importing this module registers the builder.
"""

import io

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

NUM_CLASSES = 4
SIZES = {"train": 64, "test": 20}


def jpeg(height: int, width: int, label: int, rng: np.random.RandomState) -> bytes:
  """A JPEG (Pillow, quality 90) of a noisy colour field for `label`."""
  base = np.zeros([height, width, 3])
  base[..., label % 3] = 200 if label < 3 else 100
  pixels = np.clip(base + rng.normal(0, 20, base.shape) + np.linspace(0, 40, width)[None, :, None], 0, 255)
  out = io.BytesIO()
  Image.fromarray(pixels.astype(np.uint8)).save(out, format="JPEG", quality=90)
  return out.getvalue()


class VarsizeJpegs(tfds.core.GeneratorBasedBuilder):
  """JPEGs of 24..64 x 24..64 pixels, labels 0..3."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description="Generated JPEGs of varying size.",
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg"),
            "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES)}),
        supervised_keys=("image", "label"))

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
    del dl_manager
    return {split: self._generate_examples(split, n) for split, n in SIZES.items()}

  def _generate_examples(self, split: str, n: int):
    rng = np.random.RandomState(len(split))
    for i in range(n):
      label = i % NUM_CLASSES
      yield i, {"image": jpeg(rng.randint(24, 65), rng.randint(24, 65), label, rng), "label": label}
