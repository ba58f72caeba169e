"""`synthetic_jpegs`: generated JPEGs of varying size, each a function of its index, opened by name."""

import io

import ml_collections
from PIL import Image

from jaxdp import data
from jaxdp.datasets import synthetic_jpegs


def _open(index: int) -> Image.Image:
  return Image.open(io.BytesIO(synthetic_jpegs.jpeg(index, (30, 40), (50, 60))))


def test_jpeg_is_a_function_of_its_index_with_sizes_in_the_ranges():
  images = [_open(i) for i in range(8)]
  assert all(image.format == "JPEG" and image.mode == "RGB" for image in images)
  assert all(50 <= width <= 60 and 30 <= height <= 40 for width, height in (image.size for image in images))
  assert len({image.size for image in images}) > 1
  assert synthetic_jpegs.jpeg(3, (30, 40), (50, 60)) == synthetic_jpegs.jpeg(3, (30, 40), (50, 60))


def test_opens_by_registered_name_with_builder_kwargs(tmp_path):
  kwargs = {"num_train": 6, "num_test": 3, "num_classes": 3, "height": (16, 24), "width": (16, 24)}
  ds = data.load(ml_collections.ConfigDict({"name": "synthetic_jpegs", "data_dir": str(tmp_path), "image_size": 8,
                                            "builder_kwargs": kwargs}))
  assert (ds.num_examples("train"), ds.num_examples("test")) == (6, 3)
  assert ds.num_classes == 3 and ds.input_shape == (8, 8, 3)
