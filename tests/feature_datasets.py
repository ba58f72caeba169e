"""TFDS builders whose examples are a features dict (an image, a mask, a float target, a nested dict), named by
"feature_datasets:Scenes" (no supervised keys: every feature under its own name) and
"feature_datasets:SupervisedScenes" (the same, with supervised keys image -> target)."""

from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds

NUM_TRAIN, NUM_TEST = 48, 20


class Scenes(tfds.core.GeneratorBasedBuilder):
  """8x8 RGB images, a boolean mask of each, a float target [2] and meta/id, meta/weight: 48 train, 20 test."""

  VERSION = tfds.core.Version("1.0.0")
  SUPERVISED: tuple[str, str] | None = None

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(8, 8, 3)),
            "mask": tfds.features.Tensor(shape=(8, 8), dtype=np.bool_),
            "target": tfds.features.Tensor(shape=(2,), dtype=np.float32),
            "meta": tfds.features.FeaturesDict({"id": np.int64, "weight": np.float32}),
            "name": tfds.features.Text(),  # Text: no array type on a device, left out of batches.
        }),
        supervised_keys=self.SUPERVISED,
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
    del dl_manager
    return {"train": self._generate_examples(NUM_TRAIN, 0), "test": self._generate_examples(NUM_TEST, 1000)}

  def _generate_examples(self, n: int, first_id: int) -> Iterator[tuple[int, dict]]:
    for i in range(first_id, first_id + n):
      yield i, example(i)


def example(id: int) -> dict:
  """The example of id `id` (train: 0..47, test: 1000..1019), every feature a function of it."""
  rng = np.random.RandomState(id)
  image = rng.randint(0, 256, (8, 8, 3)).astype(np.uint8)
  return {"image": image, "mask": image[..., 0] > 127, "target": rng.randn(2).astype(np.float32),
          "meta": {"id": id, "weight": np.float32(1 + id % 3)}, "name": f"scene {id}"}


class SupervisedScenes(Scenes):
  """Scenes with supervised keys: image -> "inputs", target -> "labels" (float labels), the others by name."""

  SUPERVISED = ("image", "target")


class NestedInputScenes(Scenes):
  """Scenes whose supervised input is itself a FeaturesDict ({"scene": {image, mask}}, target): it once crashed
  jaxdp's reader; its features come under their own names, flattened ("scene/image", "scene/mask", "target")."""

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            "scene": tfds.features.FeaturesDict({"image": tfds.features.Image(shape=(8, 8, 3)),
                                                 "mask": tfds.features.Tensor(shape=(8, 8), dtype=np.bool_)}),
            "target": tfds.features.Tensor(shape=(2,), dtype=np.float32),
        }),
        supervised_keys=("scene", "target"),
    )

  def _generate_examples(self, n: int, first_id: int) -> Iterator[tuple[int, dict]]:
    for i, e in super()._generate_examples(n, first_id):
      yield i, {"scene": {"image": e["image"], "mask": e["mask"]}, "target": e["target"]}


class TaggedRows(Scenes):
  """Rows of 4 token ids, each tagged with one of 5 classes (a Sequence of ClassLabel): labels [4], 5 classes."""

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            "tokens": tfds.features.Tensor(shape=(4,), dtype=np.int32),
            "tags": tfds.features.Sequence(tfds.features.ClassLabel(num_classes=5), length=4),
        }),
        supervised_keys=("tokens", "tags"),
    )

  def _generate_examples(self, n: int, first_id: int) -> Iterator[tuple[int, dict]]:
    for i in range(first_id, first_id + n):
      yield i, {"tokens": np.arange(i, i + 4, dtype=np.int32), "tags": [(i + k) % 5 for k in range(4)]}


class ClashingScenes(Scenes):
  """Scenes with a feature named "inputs" besides the supervised input: two features a batch would call "inputs"."""

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(8, 8, 3)),
            "inputs": tfds.features.Tensor(shape=(2,), dtype=np.float32),
            "target": tfds.features.Tensor(shape=(2,), dtype=np.float32),
        }),
        supervised_keys=("image", "target"),
    )

  def _generate_examples(self, n: int, first_id: int) -> Iterator[tuple[int, dict]]:
    for i in range(first_id, first_id + n):
      scene = example(i)
      yield i, {"image": scene["image"], "inputs": scene["target"], "target": scene["target"]}
