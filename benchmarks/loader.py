"""Loader only: images/s of jaxdp's JPEG pipeline against the tf.data pipeline users copy, and Grain's.

    python benchmarks/loader.py [--cores 1,2] [--rounds 5] [--batches 40] [--warmup 8] [--images 640] \
        [--pipelines jaxdp,tfdata,grain] [--before CHECKOUT] [--out loader.md]

One folder of --images JPEGs of 300-500 px (10 class subfolders, made with Pillow), read as ImageNet training
reads it: a random-resized crop to 224 x 224, a random flip, per-channel mean/std, batch 64, each batch put on
the device (`jax.device_put`, blocked on). Each run is a fresh process pinned with `taskset` to the first N cores:
  jaxdp   `DataParallel(image_size=224, flip=True, mean, std, cache_mb=0).batches(folder, batch_size=64)`;
  tfdata  the Flax ImageNet example's input pipeline written by hand on the files: read_file,
          sample_distorted_bounding_box + decode_and_crop_jpeg, bicubic resize, random flip, normalize,
          AUTOTUNE parallel map, batch, prefetch;
  grain   `grain.MapDataset` over the files, Pillow decode, crop and bicubic resize, flip, numpy normalize,
          batched, with one worker process per core;
  before  (--before) a checkout's jaxdp, the same as `jaxdp`.
Rounds alternate the pipelines (A B C, B C A, ...); reported: median images/s over rounds (min..max), the
per-round ratio to tf.data, images per CPU-second (all the process's threads and workers: less disturbed by other
jobs on a shared machine), and each run's peak RSS (the main process's; Grain's workers are added).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402

PIPELINES = ("jaxdp", "tfdata", "grain")
IMAGE_SIZE, BATCH = 224, 64
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # Of pixels in [0, 1].
CLASSES = 10


def make_folder(root: str, n: int) -> str:
  """`n` JPEGs of 300..500 px a side in CLASSES class subfolders (photo-like: smooth colours and noise)."""
  from PIL import Image
  folder = os.path.join(root, "images")
  for i in range(n):
    rng = np.random.RandomState(i)
    h, w = rng.randint(300, 501, 2)
    small = rng.randint(0, 256, (h // 16 + 1, w // 16 + 1, 3)).astype(np.uint8)
    base = np.asarray(Image.fromarray(small).resize((int(w), int(h)), Image.BICUBIC)).astype(np.float32)
    pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
    os.makedirs(os.path.join(folder, f"c{i % CLASSES}"), exist_ok=True)
    Image.fromarray(pixels).save(os.path.join(folder, f"c{i % CLASSES}", f"{i:05d}.jpg"), quality=90)
  return folder


def files(folder: str) -> tuple[list[str], list[int]]:
  """The folder's JPEG paths and labels, sorted."""
  paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs if f.endswith(".jpg"))
  return paths, [int(os.path.basename(os.path.dirname(p))[1:]) for p in paths]


def jaxdp_batches(folder: str, data_dir: str):
  """jaxdp's batches as a user asks for them (the train split of the folder, forever)."""
  import jaxdp
  dp = jaxdp.DataParallel(image_size=IMAGE_SIZE, flip=True, mean=MEAN, std=STD, cache_mb=0, data_dir=data_dir)
  feeder = dp.batches(folder, batch_size=BATCH, seed=0)
  return (block for block, _ in feeder)


def tfdata_batches(folder: str, data_dir: str):
  """The Flax ImageNet example's `create_split` + `preprocess_for_train`, on the files, put on the device."""
  del data_dir
  import jax
  import tensorflow as tf
  tf.config.set_visible_devices([], "GPU")
  paths, labels = files(folder)

  def decode(path: tf.Tensor, label: tf.Tensor) -> dict:
    image_bytes = tf.io.read_file(path)
    shape = tf.io.extract_jpeg_shape(image_bytes)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape, bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]), min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
    offset_y, offset_x, _ = tf.unstack(begin)
    target_h, target_w, _ = tf.unstack(size)
    crop = tf.image.decode_and_crop_jpeg(image_bytes, tf.stack([offset_y, offset_x, target_h, target_w]), channels=3)
    image = tf.image.resize([crop], [IMAGE_SIZE, IMAGE_SIZE], method=tf.image.ResizeMethod.BICUBIC)[0]
    image = tf.image.random_flip_left_right(image)
    image = (image - tf.constant([m * 255 for m in MEAN])) / tf.constant([s * 255 for s in STD])
    return {"image": tf.image.convert_image_dtype(image, tf.float32), "label": label}

  ds = tf.data.Dataset.from_tensor_slices((paths, labels)).repeat().shuffle(16 * BATCH, seed=0)
  ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH, drop_remainder=True).prefetch(10)
  return (jax.device_put(b) for b in ds.as_numpy_iterator())


class GrainCrop:
  """Grain's per-example transform: Pillow decode, random-resized crop (torchvision's), bicubic resize, flip."""

  def __init__(self, paths: list[str], labels: list[int]):
    self.paths, self.labels = paths, labels

  def __call__(self, index: int) -> dict:
    from PIL import Image
    rng = np.random.default_rng(index)
    with Image.open(self.paths[index % len(self.paths)]) as im:
      w, h = im.size
      box = (0, 0, w, h)
      for _ in range(10):
        area = h * w * rng.uniform(0.08, 1.0)
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw, ch = int(round(np.sqrt(area * ratio))), int(round(np.sqrt(area / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
          top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
          box = (left, top, left + cw, top + ch)
          break
      image = np.asarray(im.convert("RGB").resize((IMAGE_SIZE, IMAGE_SIZE), Image.BICUBIC, box=box))
    if rng.random() < 0.5:
      image = image[:, ::-1]
    return {"image": image, "label": np.int32(self.labels[index % len(self.labels)])}


def normalize(batch: dict) -> dict:
  """A uint8 batch to float32, normalized (numpy, in the main process)."""
  x = batch["image"].astype(np.float32) / 255
  return {"image": (x - np.float32(MEAN)) / np.float32(STD), "label": batch["label"]}


def grain_batches(folder: str, data_dir: str):
  """`grain.MapDataset` over the file indices, shuffled, mapped by GrainCrop in one worker process per core."""
  del data_dir
  import grain
  import jax
  from absl import flags
  flags.FLAGS.mark_as_parsed()  # Grain reads its absl flags; a script without absl.app must parse them.
  paths, labels = files(folder)
  ds = grain.MapDataset.range(10**9).shuffle(seed=0).map(GrainCrop(paths, labels)).batch(BATCH, drop_remainder=True)
  it = ds.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=len(os.sched_getaffinity(0))))
  return (jax.device_put(normalize(b)) for b in it)


def one_run(pipeline: str, folder: str, data_dir: str, batches: int, warmup: int) -> dict:
  """This process's run of one pipeline: images/s over `batches` after `warmup`, and its peak RSS (MiB)."""
  import jax
  make = {"jaxdp": jaxdp_batches, "before": jaxdp_batches, "tfdata": tfdata_batches, "grain": grain_batches}[pipeline]
  it = make(folder, data_dir)
  for _ in range(warmup):
    jax.block_until_ready(next(it))
  start, cpu = time.perf_counter(), cpu_seconds()
  for _ in range(batches):
    jax.block_until_ready(next(it))
  rate = batches * BATCH / (time.perf_counter() - start)
  per_cpu = batches * BATCH / (cpu_seconds() - cpu)
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  if pipeline == "grain":  # Its worker processes hold the decoded images: the largest child's peak, per worker.
    rss += resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 * len(os.sched_getaffinity(0))
  return {"images_per_s": rate, "images_per_cpu_s": per_cpu, "peak_rss_mib": rss}


def cpu_seconds() -> float:
  """CPU seconds of this process's threads and of its live child processes (Grain's workers)."""
  import psutil
  me = psutil.Process()
  return sum(sum(p.cpu_times()[:2]) for p in [me, *me.children(recursive=True)])


def measure(pipeline: str, tree: str, cores: int, folder: str, data_dir: str, batches: int, warmup: int) -> dict:
  """One fresh process of `pipeline` pinned to the first `cores` cores (`tree`: whose jaxdp it imports)."""
  cmd = ["taskset", "-c", f"0-{cores - 1}", sys.executable, os.path.abspath(__file__), "--one", pipeline,
         "--folder", folder, "--data_dir", data_dir, "--batches", str(batches), "--warmup", str(warmup)]
  env = {**os.environ, "PYTHONPATH": tree, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
  out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
  if out.returncode:
    raise RuntimeError(f"{pipeline} failed ({out.returncode}):\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cores", default="1,2", help="Core counts to run each pipeline on (taskset), comma-separated.")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--batches", type=int, default=40, help="Timed batches per run.")
  parser.add_argument("--warmup", type=int, default=8, help="Untimed batches first (tracing, buffers, autotune).")
  parser.add_argument("--images", type=int, default=640)
  parser.add_argument("--pipelines", default=",".join(PIPELINES))
  parser.add_argument("--before", default="", help="A checkout of jaxdp to alternate with, as pipeline `before`.")
  parser.add_argument("--out", default=None, help="Markdown results (also printed).")
  parser.add_argument("--one", default="", help=argparse.SUPPRESS)
  parser.add_argument("--folder", default="", help=argparse.SUPPRESS)
  parser.add_argument("--data_dir", default="", help=argparse.SUPPRESS)
  return parser.parse_args(argv)


def report(runs: dict, cores: list[int], load_before: float) -> list[str]:
  """The results table: per core count and pipeline, images/s, the ratio to tf.data per round, peak RSS."""
  lines = abrun.header("Loader only: images/s of the JPEG pipeline (224 crop, flip, mean/std, batch 64)",
                       load_before, "CPU (jax.device_put of each batch)")
  lines += ["| cores | pipeline | images/s | / tf.data (per round) | images per CPU-second | peak RSS, MiB |",
            "|---|---|---|---|---|---|"]
  for (n, name), rs in runs.items():
    rate = [r["images_per_s"] for r in rs]
    vs = abrun.fmt(abrun.ratios(rate, [r["images_per_s"] for r in runs[(n, "tfdata")]])) if (n, "tfdata") in runs else ""
    rss = statistics.median(r["peak_rss_mib"] for r in rs)
    per_cpu = abrun.fmt_rate([r["images_per_cpu_s"] for r in rs])
    lines.append(f"| {n} | {name} | {abrun.fmt_rate(rate)} | {vs} | {per_cpu} | {rss:,.0f} |")
  return lines


def main(argv: list[str]) -> dict:
  args = parse(argv)
  if args.one:
    print(json.dumps(one_run(args.one, args.folder, args.data_dir, args.batches, args.warmup)))
    return {}
  cores = [int(c) for c in args.cores.split(",")]
  names = args.pipelines.split(",") + (["before"] if args.before else [])
  trees = {name: os.path.abspath(args.before) if name == "before" else abrun.REPO for name in names}
  load_before = abrun.load()
  runs: dict[tuple[int, str], list[dict]] = {}
  with tempfile.TemporaryDirectory(prefix="loader_") as tmp:
    folder, data_dir = make_folder(tmp, args.images), os.path.join(tmp, "tfds")
    for tree in sorted(set(trees.values())):  # The folder prepared once (TFDS), outside the timed runs.
      measure("jaxdp", tree, max(cores), folder, data_dir, 1, 1)
    for r in range(args.rounds):
      for n in cores:
        for name in abrun.in_turn(names, r):
          runs.setdefault((n, name), []).append(measure(name, trees[name], n, folder, data_dir, args.batches,
                                                        args.warmup))
  abrun.write(args.out, report(runs, cores, load_before))
  return {f"{n}/{name}": rs for (n, name), rs in runs.items()}


if __name__ == "__main__":
  main(sys.argv[1:])
