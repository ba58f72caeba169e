"""Input-pipeline headroom: the pipeline's batch rate against the train step's, measured in one run.

    python experiments/pipeline_bench.py [--datasets digits,cifar10] [--rounds 7] [--seconds 4] \
        [--cpu_devices N] [--out experiments/pipeline_bench.md]

For each dataset's built-in config (digits: configs/default.py, cifar10: configs/cifar10.py, under
tfds.testing.mock_data when cifar10 is not prepared) it alternates, round after round (the order
rotating: A B C, B C A, C A B, ...):
  A  pipeline alone: data.train_batches -> parallel.prefetch (host -> device) -> block until on device;
  B  train step on device-resident synthetic data (one device batch reused), steps in flight bounded
     as in train.py;
  C  train step fed from the real pipeline (its own iterator, prefetched to devices as in train.py).
After a warm-up, each phase runs a fixed number of batches that takes about `--seconds`. Ratios are
taken within each round; their median and spread (min..max) over rounds are reported:
headroom = A / B (target >= 2), fed = C / B (target >= 0.95).

`imagenet` (in --datasets) is the ImageNet-like case: generated variable-size JPEGs of about 400 x 350
pixels (`synthetic_jpegs`: jaxdp/datasets/synthetic_jpegs.py, about 80 KB each) cropped to 224 x 224 for
training (random-resized crop, flip, normalization to float32). It compares images/s of jaxdp's pipeline
(random access by index from ArrayRecord, `data.train_batches`) with a plain tf.data pipeline doing the same
decode + crop as the Flax ImageNet example (`as_dataset` of a TFRecord copy, shuffle buffer, parallel map, batch,
prefetch), alternating J T, T J, ... rounds, each phase on a fresh pipeline (dropped after it, so an idle one
never works in the background); per core = images/s / the machine's cores (both use all of them).
"""

import sys

from jaxdp.runtime import cpu_devices

if (_count := cpu_devices.requested(sys.argv)) is not None:  # Before JAX is imported.
  cpu_devices.simulate(_count)

import argparse  # noqa: E402
import collections  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

from jaxdp import config as config_lib  # noqa: E402
from jaxdp import data, models, optim, parallel  # noqa: E402
from jaxdp import step as step_lib  # noqa: E402
from jaxdp.configs import cifar10, default  # noqa: E402
from jaxdp.datasets import synthetic_jpegs  # noqa: E402
from jaxdp.loop import step_metrics  # noqa: E402

CONFIGS = {"digits": default.get_config, "cifar10": cifar10.get_config}
MOCK_EXAMPLES = 10_000  # Mocked cifar10 train split: 78 batches of 128 per epoch (epoch boundaries included).


def main(argv: list[str]) -> None:
  args = _parse(argv)
  load_before = os.getloadavg()[0]
  rows, imagenet = [], None
  for name in args.datasets.split(","):
    if name == "imagenet":
      imagenet = measure_imagenet(args.data_dir, args.rounds, args.seconds, args.images, args.batch)
      continue
    config = CONFIGS[name]()
    config.dataset.data_dir = args.data_dir
    with _source(name, args.data_dir) as source:
      source += f"; {config.model.name}, batch {config.batch_size}"
      rows.append((name, source, measure(config, args.rounds, args.seconds, args.warmup)))
  report = _report(rows, args, " ".join([os.path.relpath(sys.argv[0])] + argv), load_before)
  if imagenet:
    report += _imagenet_report(imagenet, args)
  print(report)
  if args.out:
    with open(args.out, "w") as f:
      f.write(report)


def _parse(argv: list[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--datasets", default="digits,cifar10,imagenet")
  p.add_argument("--images", type=int, default=512, help="imagenet: generated train images")
  p.add_argument("--batch", type=int, default=64, help="imagenet: batch size")
  p.add_argument("--rounds", type=int, default=7)
  p.add_argument("--seconds", type=float, default=4.0, help="about this long per phase and round")
  p.add_argument("--warmup", type=int, default=10, help="batches before timing (compile, buffers)")
  p.add_argument("--data_dir", default=os.path.expanduser("~/tensorflow_datasets"))
  p.add_argument("--cpu_devices", type=int, default=None, help="simulate this many CPU devices")
  p.add_argument("--out", default=None, help="write the results (markdown) here")
  return p.parse_args(argv)


@contextlib.contextmanager
def _source(name: str, data_dir: str) -> Iterator[str]:
  """Real data when prepared (digits always is, once generated); otherwise tfds mock data."""
  if name == "digits" or tfds.builder(name, data_dir=data_dir).is_prepared():
    yield "prepared TFDS data"
  else:
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
      yield f"tfds.testing.mock_data ({MOCK_EXAMPLES:,} random examples per split)"


def measure(config, rounds: int, seconds: float, warmup: int) -> dict[str, list[float]]:
  """Rates (batches/s) of phases A, B, C per round, alternating A B C A B C ..."""
  layout = config_lib.validate(config, jax.device_count(), jax.process_count())
  backend = parallel.make_backend(config.parallel.backend)
  ds = data.load(config.dataset)
  model = models.get_model(config.model, ds.input_shape, ds.num_classes)
  tx = optim.make(config)
  state = backend.init(functools.partial(step_lib.init_state, jax.random.PRNGKey(0), model=model, tx=tx))
  train_step = backend.map_train(functools.partial(step_lib.train_step, model=model, tx=tx))

  def host_batches() -> Iterator:
    return data.train_batches(ds, config.dataset.train_split, seed=config.seed, global_batch=layout.global_batch,
                              start_step=0, process_index=jax.process_index(), process_count=jax.process_count())

  alone, fed = (parallel.prefetch(backend, host_batches(), config.parallel.prefetch) for _ in range(2))
  synthetic = backend.put_batch({k: _like(v, ds.num_classes) for k, v in next(host_batches()).items()})
  in_flight = step_metrics.MAX_STEPS_IN_FLIGHT
  state_box = [state]

  def run_steps(next_batch: Callable[[], object], n: int) -> None:
    state_box[0] = _train(train_step, state_box[0], next_batch, n, in_flight)

  phases = {
      "A": lambda n: _drain(alone, n),
      "B": lambda n: run_steps(lambda: synthetic, n),
      "C": lambda n: run_steps(lambda: next(fed), n),
  }
  counts = {}
  for key, phase in phases.items():
    phase(warmup)
    counts[key] = max(5, round(seconds / _seconds(phase, 5) * 5))  # Batches that take about `seconds`.
  rates: dict[str, list[float]] = collections.defaultdict(list)
  keys = list(phases)
  for r in range(rounds):
    for key in keys[r % 3:] + keys[:r % 3]:  # A B C, B C A, C A B, ...: no phase always follows the same one.
      rates[key].append(counts[key] / _seconds(phases[key], counts[key]))
  return dict(rates)


def measure_imagenet(data_dir: str, rounds: int, seconds: float, images: int, batch: int) -> dict[str, list[float]]:
  """Images/s of jaxdp's pipeline (J) and of a Flax-example tf.data pipeline (T), alternating J T, T J, ..."""
  kwargs = {"num_train": images, "num_test": 16}
  config = ml_collections.ConfigDict({"name": "synthetic_jpegs", "data_dir": data_dir,
                                      "builder_kwargs": kwargs, "image_size": 224, "flip": True,
                                      "mean": MEAN, "std": STD, "prefetch": 4})
  ds = data.load(config)
  tf_dir = os.path.join(data_dir, "tfrecord")

  def jaxdp_batches(r: int) -> Iterator:
    return data.train_batches(ds, "train", seed=r, global_batch=batch, start_step=0, process_index=0, process_count=1)

  def tf_batches(r: int) -> Iterator:
    return _flax_like_pipeline(tf_dir, kwargs, batch, seed=r)

  # A fresh pipeline per phase, dropped after it: an idle pipeline would keep filling its buffers in the
  # background, stealing the cores from the other and handing out its stock for free when timed next.
  phases = {"J": jaxdp_batches, "T": tf_batches}
  counts = {key: max(3, round(seconds / _pipeline_seconds(make, 0, 3, 3) * 3)) for key, make in phases.items()}
  rates: dict[str, list[float]] = collections.defaultdict(list)
  for r in range(rounds):
    for key in ("J", "T") if r % 2 == 0 else ("T", "J"):
      rates[key].append(counts[key] * batch / _pipeline_seconds(phases[key], r, 3, counts[key]))
  return dict(rates)


def _pipeline_seconds(make: Callable[[int], Iterator], r: int, warmup: int, n: int) -> float:
  """Seconds to pull n batches from a fresh pipeline after `warmup` batches (then the pipeline is dropped)."""
  batches = make(r)
  _drain_host(batches, warmup)
  seconds = _seconds(lambda k: _drain_host(batches, k), n)
  del batches
  return seconds


MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _flax_like_pipeline(data_dir: str, kwargs: dict, batch: int, seed: int) -> Iterator:
  """The Flax ImageNet example's train input: TFRecord, shuffle, decode + random crop + flip, batch."""
  builder = synthetic_jpegs.SyntheticJpegs(data_dir=data_dir, file_format="tfrecord", **kwargs)
  builder.download_and_prepare()
  mean, std = tf.constant(MEAN) * 255, tf.constant(STD) * 255

  def decode(example: dict) -> dict:
    encoded = example["image"]
    shape = tf.io.extract_jpeg_shape(encoded)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape, tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]), min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.io.decode_and_crop_jpeg(encoded, window, channels=3)
    image = tf.image.resize([image], [224, 224], method=tf.image.ResizeMethod.BICUBIC)[0]
    image = tf.image.random_flip_left_right(image)
    return {"inputs": (image - mean) / std, "labels": tf.cast(example["label"], tf.int32)}

  ds = builder.as_dataset(split="train", decoders={"image": tfds.decode.SkipDecoding()}, shuffle_files=True)
  ds = ds.repeat().shuffle(16 * batch, seed=seed).map(decode, num_parallel_calls=tf.data.AUTOTUNE)
  return iter(tfds.as_numpy(ds.batch(batch, drop_remainder=True).prefetch(10)))


def _drain_host(batches: Iterator, n: int) -> None:
  for _ in range(n):
    next(batches)


def _seconds(phase: Callable[[int], None], n: int) -> float:
  start = time.perf_counter()
  phase(n)
  return time.perf_counter() - start


def _like(x: np.ndarray, num_classes: int) -> np.ndarray:
  """Random host data with the shape and dtype of `x` (labels below num_classes)."""
  rng = np.random.default_rng(0)
  if np.issubdtype(x.dtype, np.floating):
    return rng.standard_normal(x.shape).astype(x.dtype)
  return rng.integers(0, num_classes, x.shape).astype(x.dtype)


def _drain(batches: Iterator, n: int) -> None:
  """Pulls n device batches, each complete on its devices (the hand-off included)."""
  for _ in range(n):
    jax.block_until_ready(next(batches))


def _train(train_step, state, next_batch: Callable[[], object], n: int, max_in_flight: int):
  """n steps as train.py runs them: asynchronous dispatch, at most `max_in_flight` steps pending."""
  pending: collections.deque = collections.deque()
  for _ in range(n):
    state, metrics = train_step(state, next_batch())
    pending.append(metrics)
    while len(pending) >= max_in_flight:
      jax.block_until_ready(pending.popleft())
  jax.block_until_ready((state, list(pending)))
  return state


def _summary(values: list[float]) -> str:
  return f"{_num(statistics.median(values))} ({_num(min(values))}..{_num(max(values))})"


def _num(x: float) -> str:
  return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _report(rows: list, args: argparse.Namespace, command: str, load_before: float) -> str:
  """Markdown: machine, command, then per dataset the rates and the ratios (median, min..max over rounds)."""
  dev = jax.devices()[0]
  lines = [
      "# Input pipeline headroom",
      "",
      f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
      f"- machine: {_cpu_model()} ({platform.machine()}), {os.cpu_count()} CPU cores; 1-minute load average "
      f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (other jobs share the cores)",
      f"- devices: {jax.device_count()} x {dev.platform} ({dev.device_kind}); jax {jax.__version__}",
      f"- command: `{command}`",
      f"- {args.rounds} rounds of A B C (order rotating), each phase about {args.seconds:g} s "
      f"(a batch count fixed per phase after {args.warmup} warm-up batches)",
      "",
      "A = pipeline alone (host batches + hand-off to devices), B = train step on device-resident synthetic",
      "data, C = train step fed by the pipeline; batches/s as median (min..max over rounds); ratios per round.",
      "",
      "| dataset | data, model, global batch | A pipeline b/s | B step b/s | C fed b/s | headroom A/B (>= 2) "
      "| fed C/B (>= 0.95) |",
      "| --- | --- | --- | --- | --- | --- | --- |",
  ]
  for name, source, r in rows:
    headroom = [a / b for a, b in zip(r["A"], r["B"])]
    fed = [c / b for c, b in zip(r["C"], r["B"])]
    lines.append(f"| {name} | {source} | {_summary(r['A'])} | {_summary(r['B'])} | {_summary(r['C'])} | "
                 f"{_summary(headroom)} | {_summary(fed)} |")
  return "\n".join(lines) + "\n"


def _imagenet_report(r: dict[str, list[float]], args: argparse.Namespace) -> str:
  cores = os.cpu_count()
  ratio = [j / t for j, t in zip(r["J"], r["T"])]
  per_core = {k: [x / cores for x in v] for k, v in r.items()}
  return "\n".join([
      "",
      "## ImageNet-like: variable-size JPEGs -> 224 x 224 train crops",
      "",
      f"{args.images} generated JPEGs of 250..450 x 300..500 pixels (about 80 KB each, "
      f"`synthetic_jpegs`), batch {args.batch}, random-resized crop + flip + normalization to float32; "
      f"{args.rounds} rounds alternating J T / T J; images/s as median (min..max); per core = images/s / "
      f"{cores} cores.",
      "",
      "| pipeline | images/s | images/s per core |",
      "| --- | --- | --- |",
      f"| J: jaxdp (ArrayRecord by index, stateless order and crops) | {_summary(r['J'])} | "
      f"{_summary(per_core['J'])} |",
      f"| T: tf.data as the Flax ImageNet example (TFRecord, shuffle buffer) | {_summary(r['T'])} | "
      f"{_summary(per_core['T'])} |",
      f"| ratio J / T (>= 1.0) | {_summary(ratio)} | |",
  ]) + "\n"


def _cpu_model() -> str:
  with contextlib.suppress(OSError):
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  return "unknown CPU"


if __name__ == "__main__":
  main(sys.argv[1:])
