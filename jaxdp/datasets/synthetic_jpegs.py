"""`synthetic_jpegs`: generated JPEGs of varying size (ImageNet-like by default; 256 train, 64 test), labels cycling
through the classes with no signal (as torchvision's FakeData), for the input pipeline offline."""

import dataclasses
import io

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

TEST_OFFSET = 10**9  # The test split's first index: its images differ from the train split's.


def jpeg(index: int, height: tuple[int, int], width: tuple[int, int]) -> bytes:
  """Image `index` as JPEG bytes, of height and width drawn from the inclusive ranges given."""
  rng = np.random.RandomState(index)
  h, w = rng.randint(height[0], height[1] + 1), rng.randint(width[0], width[1] + 1)
  small = rng.randint(0, 256, (h // 16 + 1, w // 16 + 1, 3)).astype(np.uint8)  # A 16-pixel grid of colours...
  base = np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC)).astype(np.float32)  # ...smoothed,
  pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)  # with noise for photo-like bytes.
  out = io.BytesIO()
  Image.fromarray(pixels).save(out, format="JPEG", quality=90)
  return out.getvalue()


@dataclasses.dataclass
class SizeConfig(tfds.core.BuilderConfig):
  """How many images, of how many classes, in which ranges of size (inclusive)."""
  num_train: int = 256
  num_test: int = 64
  num_classes: int = 10
  height: tuple[int, int] = (250, 450)
  width: tuple[int, int] = (300, 500)


class SyntheticJpegs(tfds.core.GeneratorBasedBuilder):
  """Generated JPEGs of varying size; the builder's keyword arguments are `SizeConfig`'s fields."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, num_train: int = 256, num_test: int = 64, num_classes: int = 10,
               height: tuple[int, int] = (250, 450), width: tuple[int, int] = (300, 500), **kwargs):
    (h0, h1), (w0, w1) = height, width
    # The name holds every field, so each size of dataset is prepared in a folder of its own.
    name = f"n{num_train}-{num_test}-c{num_classes}-h{h0}-{h1}-w{w0}-{w1}"
    kwargs["config"] = SizeConfig(name=name, num_train=num_train, num_test=num_test, num_classes=num_classes,
                                  height=(h0, h1), width=(w0, w1))
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description="Generated JPEGs of varying size (random smooth colour fields, noise).",
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg"),
            "label": tfds.features.ClassLabel(num_classes=self.builder_config.num_classes)}),
        supervised_keys=("image", "label"))

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
    del dl_manager
    c = self.builder_config
    return {"train": self._generate_examples(0, c.num_train), "test": self._generate_examples(TEST_OFFSET, c.num_test)}

  def _generate_examples(self, first: int, n: int):
    c = self.builder_config
    for i in range(first, first + n):
      yield i, {"image": jpeg(i, c.height, c.width), "label": i % c.num_classes}
