"""Grain on the ImageNet-like case of pipeline_bench: images/s of a grain.MapDataset doing the same crop + flip.

    python experiments/grain_jpeg.py [--data_dir DIR] [--images 512] [--rounds 3]

Reads the same ArrayRecord data source as jaxdp (`synthetic_jpegs`: jaxdp/datasets/synthetic_jpegs.py), shuffles,
and decodes + crops each image in NumPy/Pillow inside a `grain.transforms.RandomMap` (random-resized crop, 8%..100% of
the area, aspect 3/4..4/3, bicubic to 224, flip, normalization), batch 64, for 2 and 8 threads.
"""

import argparse
import io
import os
import sys
import time

import grain
import ml_collections
import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxdp import data  # noqa: E402

MEAN, STD = np.array((0.485, 0.456, 0.406)) * 255, np.array((0.229, 0.224, 0.225)) * 255


class Crop(grain.transforms.RandomMap):
  """Random-resized crop, flip and normalization of one encoded image."""

  def random_map(self, example: dict, rng: np.random.Generator) -> dict:
    image = Image.open(io.BytesIO(example["image"]))
    width, height = image.size
    for _ in range(10):
      area = rng.uniform(0.08, 1.0) * width * height
      aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
      w, h = int(round(np.sqrt(area * aspect))), int(round(np.sqrt(area / aspect)))
      if 0 < w <= width and 0 < h <= height:
        x, y = rng.integers(0, width - w + 1), rng.integers(0, height - h + 1)
        break
    else:
      w = h = min(width, height)
      x, y = (width - w) // 2, (height - h) // 2
    pixels = np.asarray(image.crop((x, y, x + w, y + h)).resize((224, 224), Image.BICUBIC), np.float32)
    pixels = pixels[:, ::-1] if rng.uniform() < 0.5 else pixels
    return {"inputs": (pixels - MEAN) / STD, "labels": np.int32(example["label"])}


def main(argv: list[str]) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--data_dir", default="/tmp/jaxdp-bench")
  p.add_argument("--images", type=int, default=512)
  p.add_argument("--rounds", type=int, default=3)
  args = p.parse_args(argv)
  ds = data.load(ml_collections.ConfigDict({"name": "synthetic_jpegs", "data_dir": args.data_dir,
                                            "image_size": 224, "builder_kwargs": {"num_train": args.images,
                                                                                  "num_test": 16}}))
  records = ds.builder.as_data_source("train", decoders={"image": tfds.decode.SkipDecoding()})
  for _ in range(args.rounds):
    for threads in (2, 8):
      batches = grain.MapDataset.source(records).shuffle(seed=0).repeat().random_map(Crop(), seed=0)
      it = iter(batches.batch(64, drop_remainder=True).to_iter_dataset(
          grain.ReadOptions(num_threads=threads, prefetch_buffer_size=128)))
      for _ in range(3):
        next(it)
      start, n = time.perf_counter(), 8
      for _ in range(n):
        next(it)
      print(f"grain, {threads} threads: {n * 64 / (time.perf_counter() - start):.0f} images/s", flush=True)
      del it


if __name__ == "__main__":
  main(sys.argv[1:])
