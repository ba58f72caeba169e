"""tfds -> one seeded global order -> each process's rows of every global batch -> numpy host batches.

Default mode: the train split is read once into memory (images still encoded), and global batch
`step` holds the examples at positions [k * B, (k + 1) * B) of epoch `step // steps_per_epoch`'s
permutation, where k = step % steps_per_epoch and the permutation is a stateless shuffle seeded by
(seed, epoch). Every process computes the same global batch, keeps rows [p * B / P, (p + 1) * B / P)
and decodes only those. So the sequence of global batches depends only on the seed and the step,
never on how many processes or devices share it, every process gets the same number of batches per
epoch, and the stream is a pure function of the step: **the position to checkpoint is the train
state's step** (the number of batches consumed), and `train_batches(start_step=step)` continues
exactly there (no replay, no skip). Save the state's step, never a count of batches pulled from the
iterator: prefetching reads ahead of the step.

`dataset.shard_by_process` (opt in, for datasets too large for memory): each process streams its own
file shards (`tfds.split_for_jax_process`) through a shuffle buffer. Deterministic for a given seed
and process count, but the global batches then change with the process count.

Eval reads the split in file order, padded to whole global batches with `mask` False on the padding;
each process decodes only its rows, so every example is counted exactly once. Knows nothing of models
or devices.
"""

import contextlib
import dataclasses
import fcntl
import itertools
import math
import os
from collections.abc import Iterator
from typing import Any

import ml_collections
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from jaxdp import offline
from jaxdp.config import ConfigError
from jaxdp.preprocess import SHUFFLE, Preprocess, seed_for

# TensorFlow only feeds the input pipeline: it must never take accelerator memory.
tf.config.set_visible_devices([], "GPU")

Batch = dict[str, np.ndarray]
_EPOCHS = 2**62  # "Forever": the stream of epochs is cut by the number of steps.


@dataclasses.dataclass(frozen=True)
class Options:
  """How batches are read and prepared (`config.dataset` fields beyond the dataset's name)."""
  preprocess: Preprocess = Preprocess()
  shard_by_process: bool = False
  shuffle_buffer: int = 16_384
  prefetch: int = 2
  max_memory_gb: float = 16.0

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, input_shape: tuple[int, ...]) -> "Options":
    """Reads and checks the fields; missing ones keep their defaults."""
    d = cls()
    options = cls(Preprocess.from_config(config, input_shape), bool(config.get("shard_by_process", False)),
                  config.get("shuffle_buffer", d.shuffle_buffer), config.get("prefetch", d.prefetch),
                  config.get("max_memory_gb", d.max_memory_gb))
    if not isinstance(options.shuffle_buffer, int) or options.shuffle_buffer < 1:
      raise ConfigError(f"dataset.shuffle_buffer must be a positive integer, got {options.shuffle_buffer!r}")
    if not isinstance(options.prefetch, int) or options.prefetch < -1:
      raise ConfigError(f"dataset.prefetch must be an integer >= 0 (or -1: autotune), got {options.prefetch!r}")
    return options


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A prepared TFDS dataset, the facts about it that the trainer needs, and how to read it."""
  builder: tfds.core.DatasetBuilder
  input_key: str
  label_key: str
  options: Options = Options()
  _decoded: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)  # split -> (inputs, labels)

  @property
  def num_classes(self) -> int:
    return self.builder.info.features[self.label_key].num_classes

  @property
  def input_shape(self) -> tuple[int, ...]:
    return tuple(self.builder.info.features[self.input_key].shape)

  @property
  def integer_inputs(self) -> bool:
    """Whether inputs are integer ids (e.g. tokens) that arrive as float32 but must stay exact."""
    feature = self.builder.info.features[self.input_key]
    return not isinstance(feature, tfds.features.Image) and np.issubdtype(np.dtype(feature.np_dtype), np.integer)

  def num_examples(self, split: Any) -> int:
    """Examples in a split spec such as "test" or "train[:90%]"."""
    try:
      n = int(self.builder.as_dataset(split=split, shuffle_files=False).cardinality())
    except (KeyError, ValueError, AssertionError) as e:
      raise ConfigError(f"unknown split {split!r} of dataset {self.builder.name!r}: {e}") from None
    return n if n >= 0 else self.builder.info.splits[split].num_examples


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
  shape = tuple(builder.info.features[input_key].shape)
  if None in shape:
    raise ConfigError(f"dataset {config.name!r} has inputs of varying shape {shape!r}; jaxdp batches fixed shapes")
  options = Options.from_config(config, shape)
  if not builder.is_prepared():
    offline.check_can_prepare(builder)  # Fails in seconds, not after minutes of download retries.
    _prepare(builder)
  return Dataset(builder, input_key, label_key, options)


def _prepare(builder: tfds.core.DatasetBuilder) -> None:
  """Prepares the dataset under a file lock, so concurrent processes never corrupt it."""
  root = os.fspath(builder.data_dir_root)
  os.makedirs(root, exist_ok=True)
  lock_path = os.path.join(root, f".{builder.name}.prepare.lock")
  with open(lock_path, "w") as lock, contextlib.ExitStack() as stack:
    fcntl.flock(lock, fcntl.LOCK_EX)  # One process prepares; the others wait, then reuse it.
    stack.callback(fcntl.flock, lock, fcntl.LOCK_UN)
    builder.download_and_prepare()


def train_batches(ds: Dataset, split: str, *, seed: int, global_batch: int, start_step: int,
                  process_index: int, process_count: int) -> Iterator[Batch]:
  """This process's rows of global batches start_step, start_step+1, ... (forever)."""
  rows = global_batch // process_count
  first_row = process_index * rows
  if ds.options.shard_by_process:
    return _sharded(ds, split, seed, global_batch, start_step, process_index, process_count)
  inputs, labels = _in_memory(ds, split)
  n = int(labels.shape[0])
  steps_per_epoch = _steps_per_epoch(n, global_batch, split)
  first_epoch, skip = divmod(start_step, steps_per_epoch)

  def epoch(e: tf.Tensor) -> tf.data.Dataset:
    # One stateless permutation per epoch; its last n % global_batch examples sit this epoch out.
    order = tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int64), seed_for(seed, SHUFFLE, e))
    return tf.data.Dataset.from_tensor_slices(tf.reshape(order[:steps_per_epoch * global_batch], [-1, global_batch]))

  decode = _batch_decoder(ds)

  def gather(step: tf.Tensor, order: tf.Tensor) -> tuple[dict, tf.Tensor]:
    mine = order[first_row:first_row + rows]  # This process's rows; only they are decoded.
    return {"inputs": decode(tf.gather(inputs, mine)), "labels": tf.gather(labels, mine)}, step

  batches = tf.data.Dataset.range(first_epoch, _EPOCHS).flat_map(_plain(epoch)).skip(skip)
  batches = batches.enumerate(start=start_step).map(_plain(gather), num_parallel_calls=tf.data.AUTOTUNE,
                                                    deterministic=True)
  return _train_tail(ds, batches, seed, global_batch, first_row)


def _sharded(ds: Dataset, split: str, seed: int, global_batch: int, start_step: int, process_index: int,
             process_count: int) -> Iterator[Batch]:
  """shard_by_process: this process's own file shards, shuffled per epoch; depends on the process count."""
  rows = global_batch // process_count
  shard = tfds.split_for_jax_process(split, process_index=process_index, process_count=process_count,
                                     drop_remainder=True)  # Equal shards: the same batches per epoch everywhere.
  steps_per_epoch = _steps_per_epoch(ds.num_examples(shard), rows, f"{split} (this process's shard)")
  first_epoch, skip = divmod(start_step, steps_per_epoch)

  def epoch(e: int) -> Iterator[Batch]:
    epoch_seed = (seed * 1_000_003 + e * 7_919 + process_index) % 2**31
    examples = ds.builder.as_dataset(split=shard, as_supervised=True, shuffle_files=True,
                                     read_config=tfds.ReadConfig(shuffle_seed=epoch_seed))
    examples = examples.map(_plain(lambda x, y: {"inputs": x, "labels": y}))
    examples = examples.shuffle(ds.options.shuffle_buffer, seed=epoch_seed, reshuffle_each_iteration=False)
    batches = examples.batch(rows, drop_remainder=True).take(steps_per_epoch)
    batches = batches.enumerate(start=e * steps_per_epoch).map(_plain(lambda step, b: (b, step)))
    return _train_tail(ds, batches.skip(skip if e == first_epoch else 0), seed, global_batch, process_index * rows)

  return itertools.chain.from_iterable(map(epoch, itertools.count(first_epoch)))


def _train_tail(ds: Dataset, batches: tf.data.Dataset, seed: int, global_batch: int,
                first_row: int) -> Iterator[Batch]:
  """Augments and finishes (step-keyed, vectorized per batch), prefetches, hands out numpy."""
  def finish(batch: dict, step: tf.Tensor) -> dict:
    return ds.options.preprocess.train(batch, step, seed=seed, global_batch=global_batch, first_row=first_row)
  batches = batches.map(_plain(finish), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return iter(tfds.as_numpy(_prefetch(batches, ds.options.prefetch)))


def _steps_per_epoch(n: int, batch: int, split: str) -> int:
  if n < batch:
    raise ConfigError(f"batch ({batch}) exceeds the {n} examples of split {split!r}")
  return n // batch


def _prefetch(batches: tf.data.Dataset, depth: int) -> tf.data.Dataset:
  return batches.prefetch(tf.data.AUTOTUNE if depth == -1 else depth) if depth else batches


def _in_memory(ds: Dataset, split: str) -> tuple[tf.Tensor, tf.Tensor]:
  """The whole split as two tensors (inputs, labels) in file order, images still encoded; read once.

  Keeping images encoded lets each process decode only the rows it trains on.
  """
  if split in ds._decoded:
    return ds._decoded[split]
  n = ds.num_examples(split)
  feature = ds.builder.info.features[ds.input_key]
  gb = n * math.prod(ds.input_shape) * np.dtype(feature.np_dtype).itemsize / 2**30  # Decoded size: a bound.
  if gb > ds.options.max_memory_gb:
    raise ConfigError(f"split {split!r} of {ds.builder.name!r} needs up to {gb:.1f} GiB in memory, over "
                      f"dataset.max_memory_gb ({ds.options.max_memory_gb}); set dataset.shard_by_process=True")
  examples = _read_encoded(ds, split)
  batch = next(iter(examples.batch(max(n, 1))))
  ds._decoded[split] = (batch["inputs"], batch["labels"])
  return ds._decoded[split]


def _batch_decoder(ds: Dataset):
  """Decodes a batch of encoded images (a string vector); other inputs pass through."""
  feature = ds.builder.info.features[ds.input_key]
  if not _is_image(feature):
    return lambda x: x
  spec = tf.TensorSpec(feature.shape, tf.dtypes.as_dtype(feature.np_dtype))
  return lambda x: tf.map_fn(feature.decode_example, x, fn_output_signature=spec)


def eval_batches(ds: Dataset, split: str, *, global_batch: int, process_index: int,
                 process_count: int) -> Iterator[Batch]:
  """Every example of `split` exactly once, padded to full batches; `mask` marks the real ones."""
  n = ds.num_examples(split)
  padded = math.ceil(n / global_batch) * global_batch
  # Padding repeats real examples (so they decode like any other) with mask False.
  examples = _read_encoded(ds, split).repeat().take(padded).enumerate()
  examples = examples.map(_plain(lambda i, ex: {**ex, "id": i, "mask": i < n}))
  rows = global_batch // process_count
  lo = process_index * rows
  # Cut this process's rows out of each global batch, then decode only those.
  local = examples.batch(global_batch).map(_plain(lambda b: {k: v[lo:lo + rows] for k, v in b.items()})).unbatch()
  local = local.map(_plain(_decoder(ds)), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  local = local.batch(rows, drop_remainder=True).map(_plain(ds.options.preprocess.finish))
  return iter(tfds.as_numpy(_prefetch(local, ds.options.prefetch)))


def num_eval_steps(ds: Dataset, split: str, global_batch: int) -> int:
  """Global eval batches that cover `split` once."""
  return math.ceil(ds.num_examples(split) / global_batch)


def stream_spec(ds: Dataset, split: str, *, seed: int, global_batch: int, process_count: int) -> dict[str, Any]:
  """What the train batches depend on besides the step: save it with the step, compare on restore."""
  spec = {"dataset": ds.builder.info.full_name, "split": split, "seed": seed, "global_batch": global_batch,
          "shard_by_process": ds.options.shard_by_process}
  if ds.options.shard_by_process:
    spec.update(process_count=process_count, shuffle_buffer=ds.options.shuffle_buffer)
  return spec


def check_resume(saved: dict[str, Any], current: dict[str, Any]) -> None:
  """Raises unless resuming at the saved step continues the saved stream exactly (no replay, no skip)."""
  changed = [f"{k} {saved.get(k)!r} -> {current.get(k)!r}" for k in sorted({*saved, *current})
             if saved.get(k) != current.get(k)]
  if changed:
    raise ConfigError(f"the checkpoint's input stream differs ({'; '.join(changed)}): resuming would replay or "
                      f"skip examples; restore those values or start in a new workdir")


def _read_encoded(ds: Dataset, split: str) -> tf.data.Dataset:
  """The split's examples in their fixed file order, images still encoded."""
  feature = ds.builder.info.features[ds.input_key]
  decoders = {ds.input_key: tfds.decode.SkipDecoding()} if _is_image(feature) else None
  examples = ds.builder.as_dataset(split=split, as_supervised=True, shuffle_files=False, decoders=decoders)
  return examples.map(_plain(lambda x, y: {"inputs": x, "labels": y}))


def _decoder(ds: Dataset):
  """Decodes one (encoded) example's image; other inputs pass through."""
  feature = ds.builder.info.features[ds.input_key]

  def decode(example: dict) -> dict:
    x = feature.decode_example(example["inputs"]) if _is_image(feature) else example["inputs"]
    return {"inputs": x, "labels": example["labels"], "mask": example["mask"]}

  return decode


def _plain(fn):
  """`fn` traced as written: it has no Python control flow on tensors, so autograph would only cost time."""
  return tf.autograph.experimental.do_not_convert(fn)


def _is_image(feature: tfds.features.FeatureConnector) -> bool:
  return isinstance(feature, tfds.features.Image)
