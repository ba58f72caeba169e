"""tfds -> one seeded global order -> each process's slice of every global batch -> numpy host batches.

The sequence of global batches depends only on the seed and the step, never on how many processes or
devices share it: every process reads the same (still encoded) examples in the same order, cuts its
own rows out of each global batch, and only then decodes them. A run resumes at step s by skipping
s encoded batches. Knows nothing of models or devices.
"""

import contextlib
import dataclasses
import fcntl
import math
import os
from collections.abc import Iterator

import ml_collections
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from jaxdp.config import ConfigError

# TensorFlow only feeds the input pipeline: it must never take accelerator memory.
tf.config.set_visible_devices([], "GPU")

Batch = dict[str, np.ndarray]
_EPOCHS = 2**62  # "Forever": the stream of epochs is cut by the number of steps.


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A prepared TFDS dataset and the facts about it that the trainer needs."""
  builder: tfds.core.DatasetBuilder
  input_key: str
  label_key: str

  @property
  def num_classes(self) -> int:
    return self.builder.info.features[self.label_key].num_classes

  @property
  def input_shape(self) -> tuple[int, ...]:
    return tuple(self.builder.info.features[self.input_key].shape)

  def num_examples(self, split: str) -> int:
    """Examples in a split spec such as "test" or "train[:90%]"."""
    try:
      return self.builder.info.splits[split].num_examples
    except (KeyError, ValueError) as e:
      raise ConfigError(f"unknown split {split!r} of dataset {self.builder.name!r}: {e}") from None


def load(config: ml_collections.ConfigDict) -> Dataset:
  """Finds the TFDS builder named by `config.name`, preparing it once if needed."""
  import jaxdp.datasets  # noqa: F401  Registers the builders jaxdp ships.
  try:
    builder = tfds.builder(config.name, data_dir=config.data_dir, **dict(config.get("builder_kwargs") or {}))
  except tfds.core.registered.DatasetNotFoundError:
    raise ConfigError(f"unknown dataset {config.name!r}: no TFDS builder of that name is registered") from None
  if not builder.info.supervised_keys:
    raise ConfigError(f"dataset {config.name!r} has no supervised keys (input, label)")
  input_key, label_key = builder.info.supervised_keys[:2]
  _prepare(builder)
  return Dataset(builder, input_key, label_key)


def _prepare(builder: tfds.core.DatasetBuilder) -> None:
  """Prepares the dataset under a file lock, so concurrent processes never corrupt it."""
  root = os.path.dirname(os.path.dirname(builder.data_dir))  # data_dir/name/version -> data_dir
  os.makedirs(root, exist_ok=True)
  lock_path = os.path.join(root, f".{builder.name}.prepare.lock")
  with open(lock_path, "w") as lock, contextlib.ExitStack() as stack:
    fcntl.flock(lock, fcntl.LOCK_EX)  # One process prepares; the others wait, then reuse it.
    stack.callback(fcntl.flock, lock, fcntl.LOCK_UN)
    builder.download_and_prepare()


def train_batches(ds: Dataset, split: str, *, seed: int, global_batch: int, start_step: int,
                  process_index: int, process_count: int) -> Iterator[Batch]:
  """This process's rows of global batches start_step, start_step+1, ... (forever)."""
  n = ds.num_examples(split)
  steps_per_epoch = n // global_batch
  if steps_per_epoch == 0:
    raise ConfigError(f"batch_size ({global_batch}) exceeds the {n} examples of split {split!r}")
  first_epoch, skip = divmod(start_step, steps_per_epoch)
  examples = _read(ds, split)

  def epoch(e: tf.Tensor) -> tf.data.Dataset:
    # Each epoch is one fixed permutation (full-buffer shuffle seeded by the seed and epoch).
    shuffled = examples.shuffle(n, seed=(seed + 1) * 1_000_003 + e, reshuffle_each_iteration=False)
    return shuffled.batch(global_batch, drop_remainder=True)

  batches = tf.data.Dataset.range(first_epoch, _EPOCHS).flat_map(epoch).skip(skip)
  batches = batches.enumerate(start=start_step).map(
      lambda step, b: {**b, "id": step * global_batch + tf.range(global_batch, dtype=tf.int64)})
  return _finish(ds, batches, global_batch, process_index, process_count)


def eval_batches(ds: Dataset, split: str, *, global_batch: int, process_index: int,
                 process_count: int) -> Iterator[Batch]:
  """Every example of `split` exactly once, padded to full batches; `mask` marks the real ones."""
  n = ds.num_examples(split)
  padded = math.ceil(n / global_batch) * global_batch
  # Padding repeats real examples (so they decode like any other) with mask False.
  examples = _read(ds, split).repeat().take(padded).enumerate()
  examples = examples.map(lambda i, ex: {**ex, "id": i, "mask": i < n})
  return _finish(ds, examples.batch(global_batch), global_batch, process_index, process_count)


def num_eval_steps(ds: Dataset, split: str, global_batch: int) -> int:
  """Global eval batches that cover `split` once."""
  return math.ceil(ds.num_examples(split) / global_batch)


def _read(ds: Dataset, split: str) -> tf.data.Dataset:
  """The split's examples in their fixed file order, images still encoded."""
  feature = ds.builder.info.features[ds.input_key]
  decoders = {ds.input_key: tfds.decode.SkipDecoding()} if _is_image(feature) else None
  examples = ds.builder.as_dataset(split=split, as_supervised=True, shuffle_files=False, decoders=decoders)
  return examples.map(lambda x, y: {"inputs": x, "labels": y})


def _finish(ds: Dataset, global_batches: tf.data.Dataset, global_batch: int, process_index: int,
            process_count: int) -> Iterator[Batch]:
  """Cuts this process's rows out of each global batch, then decodes only those."""
  rows = global_batch // process_count
  lo = process_index * rows
  local = global_batches.map(lambda b: {k: v[lo:lo + rows] for k, v in b.items()}).unbatch()
  decode = _decoder(ds)
  local = local.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  local = local.batch(rows, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
  return iter(tfds.as_numpy(local))


def _decoder(ds: Dataset):
  """Decodes one example: uint8 images to float32 in [0, 1], other numbers to float32."""
  feature = ds.builder.info.features[ds.input_key]

  def decode(example: dict) -> dict:
    x = feature.decode_example(example["inputs"]) if _is_image(feature) else example["inputs"]
    x = tf.cast(x, tf.float32) / 255.0 if x.dtype == tf.uint8 else tf.cast(x, tf.float32)
    out = {"inputs": x, "labels": tf.cast(example["labels"], tf.int32)}
    if "mask" in example:
      out["mask"] = example["mask"]
    return out

  return decode


def _is_image(feature: tfds.features.FeatureConnector) -> bool:
  return isinstance(feature, tfds.features.Image)
