"""`BenchJpegs`: generated ImageNet-like JPEGs (about 400 x 350 pixels, varying sizes, 10 classes) for the input
benchmarks, as a TFDS builder named by `dataset.name="experiments.bench_jpegs:BenchJpegs"`.

    tfds.builder ... BenchJpegs(data_dir=D, num_train=3000, file_format="array_record")

Images are smooth random colour fields with noise, JPEG quality 90: about 100 KB each, close to
ImageNet's average (about 110 KB), so decoding costs what a photo's does. Deterministic per index.
"""

import dataclasses
import io

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

NUM_CLASSES = 10


def jpeg(index: int) -> tuple[bytes, int]:
  """Example `index`: (JPEG bytes of 300..500 x 250..450 pixels, label)."""
  rng = np.random.RandomState(index)
  height, width = rng.randint(250, 451), rng.randint(300, 501)
  small = rng.randint(0, 256, (height // 16 + 1, width // 16 + 1, 3)).astype(np.uint8)
  base = np.asarray(Image.fromarray(small).resize((width, height), Image.BICUBIC)).astype(np.float32)
  pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
  out = io.BytesIO()
  Image.fromarray(pixels).save(out, format="JPEG", quality=90)
  return out.getvalue(), index % NUM_CLASSES


@dataclasses.dataclass
class SizeConfig(tfds.core.BuilderConfig):
  num_train: int = 256
  num_test: int = 64


class BenchJpegs(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Variable-size JPEGs, `num_train` / `num_test` examples."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, num_train: int = 256, num_test: int = 64, **kwargs):
    kwargs["config"] = SizeConfig(name=f"n{num_train}-{num_test}", num_train=num_train, num_test=num_test)
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description="Generated ImageNet-like JPEGs.",
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg"),
            "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES)}),
        supervised_keys=("image", "label"))

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
    del dl_manager
    c = self.builder_config
    return {"train": self._generate_examples(0, c.num_train),
            "test": self._generate_examples(10**9, c.num_test)}

  def _generate_examples(self, first: int, n: int):
    for i in range(first, first + n):
      image, label = jpeg(i)
      yield i, {"image": image, "label": label}
