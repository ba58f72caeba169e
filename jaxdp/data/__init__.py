"""tfds (or any random-access source) -> one seeded global order -> each process's rows of every global batch
-> numpy host batches.

Default mode: random access. The train split is read by index from a `Source` (`jaxdp.data.source`: a
TFDS dataset prepared as ArrayRecord, or a token file); global batch `step` holds the examples at
positions [k * B, (k + 1) * B) of epoch `step // steps_per_epoch`'s permutation (`jaxdp.data.sampler`),
k = step % steps_per_epoch. Every process computes the same global batch, reads rows
[p * B / P, (p + 1) * B / P) by index and decodes only those. Nothing proportional to the split is held
in memory but the permutation of its indices. So the sequence of global batches depends only on the
seed and the step, never on how many processes or devices share it, every process gets the same number
of batches per epoch, and the stream is a pure function of the step: **the position to checkpoint is
the train state's step**, and `train_batches(start_step=step)` continues exactly there. Save the
state's step, never a count of batches pulled from the iterator: prefetching reads ahead of the step.

Reads, decoding and augmentation run in parallel tf.data workers (`num_parallel_calls`, in order).

`dataset.shard_by_process` (opt in): each process reads only its own 1/P of the split, reshuffled per
epoch (by index; or, for a dataset prepared as TFRecord only, the streaming fallback: its own file
shards, `tfds.split_for_jax_process`, through a shuffle buffer). Deterministic for a given seed and
process count, but the global batches then change with the process count.

Eval reads the split in file order, padded to whole global batches with `mask` False on the padding;
each process reads only its rows, so every example is counted exactly once. Knows nothing of models or
devices.
"""

import contextlib
import dataclasses
import fcntl
import hashlib
import itertools
import json
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import ml_collections
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from jaxdp.data import offline
from jaxdp.config import ConfigError
from jaxdp.data import images, sampler
from jaxdp.data.source import ArrayCorpus, Corpus, Facts, Source, TfdsCorpus
from jaxdp.data.preprocess import Preprocess

# TensorFlow only feeds the input pipeline: it must never take accelerator memory.
tf.config.set_visible_devices([], "GPU")

Batch = dict[str, np.ndarray]
_FOREVER = 2**62  # "Forever": the stream of steps is cut by the number of steps.
_RANDOM_ACCESS = tfds.core.file_adapters.FileFormat.ARRAY_RECORD


@dataclasses.dataclass(frozen=True)
class Options:
  """How batches are read and prepared (`config.dataset` fields beyond the dataset's name)."""
  preprocess: Preprocess = Preprocess()
  shard_by_process: bool = False
  shuffle_buffer: int = 16_384
  prefetch: int = 2
  max_memory_gb: float = 16.0  # Accepted for old configs; random access holds no split in memory.

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, input_shape: tuple[int | None, ...]) -> "Options":
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
  """A dataset (a `Corpus` of random-access splits), the facts the trainer needs, and how to read it."""
  corpus: Corpus
  options: Options = Options()
  builder: tfds.core.DatasetBuilder | None = None  # The TFDS builder, when the corpus is one.
  kind: str = "tfds-array_record"                   # The source's kind (part of the stream spec).
  _sources: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)  # split -> Source

  @property
  def name(self) -> str:
    return self.builder.name if self.builder is not None else self.corpus.facts.name

  @property
  def num_classes(self) -> int:
    return self.corpus.facts.num_classes

  @property
  def input_shape(self) -> tuple[int, ...]:
    """One example's input as the model sees it (images of varying size: cropped to image_size squares)."""
    shape, size = self.corpus.facts.input_shape, self.options.preprocess.image_size
    return (size, size, shape[-1]) if size else tuple(shape)

  @property
  def label_shape(self) -> tuple[int, ...]:
    return self.corpus.facts.label_shape

  @property
  def integer_inputs(self) -> bool:
    """Whether inputs are integer ids (e.g. tokens) that arrive as float32 but must stay exact."""
    return self.corpus.facts.integer_inputs

  def source(self, split: str) -> Source:
    """The split's random-access source (opened once)."""
    if split not in self._sources:
      self._sources[split] = self.corpus.source(split)
    return self._sources[split]

  @property
  def streamed(self) -> bool:
    """Read as a stream (shard_by_process on a dataset prepared as TFRecord only), not by index."""
    return self.options.shard_by_process and self.builder is not None and not _random_access(self.builder)

  def num_examples(self, split: Any) -> int:
    """Examples in a split spec such as "test" or "train[:90%]"."""
    if self.streamed:
      try:
        return int(self.builder.info.splits[split].num_examples)
      except (KeyError, ValueError, AssertionError) as e:
        raise ConfigError(f"unknown split {split!r} of dataset {self.builder.name!r}: {e}") from None
    return len(self.source(split))


def load(config: ml_collections.ConfigDict) -> Dataset:
  """Opens the dataset named by `config.name`, preparing it once (as ArrayRecord) if needed."""
  import jaxdp.datasets  # noqa: F401  Registers the builders jaxdp ships.
  kwargs = dict(config.get("builder_kwargs") or {})
  if config.name == "token_file":
    return _token_file(config, kwargs)
  builder = _open(lambda **extra: _builder(config.name, config.data_dir, kwargs, **extra))
  if not builder.info.supervised_keys:
    raise ConfigError(f"dataset {config.name!r} has no supervised keys (input, label)")
  input_key = builder.info.supervised_keys[0]
  options = Options.from_config(config, tuple(builder.info.features[input_key].shape))
  if not options.shard_by_process:
    _require_random_access(builder)
  corpus = TfdsCorpus(builder, keep_encoded=bool(options.preprocess.image_size))
  return Dataset(corpus, options, builder)


def _token_file(config: ml_collections.ConfigDict, kwargs: dict) -> Dataset:
  """A flat token file (`jaxdp.datasets.token_file`): windows read by index, nothing to decode."""
  from jaxdp.datasets import token_file
  splits = token_file.splits(**kwargs)
  train = splits["train"]
  digest = hashlib.sha256(json.dumps({k: s.spec() for k, s in splits.items()}, sort_keys=True).encode())
  facts = Facts(f"token_file:{os.path.basename(train.path)}@{digest.hexdigest()[:12]}", train.input_shape,
                train.input_shape, train.num_classes, integer_inputs=True)
  return Dataset(ArrayCorpus(facts, splits), Options.from_config(config, facts.input_shape), kind="token_file")


def _builder(name: str, data_dir: str | None, kwargs: dict, **extra) -> tfds.core.DatasetBuilder:
  """A user's builder (`module:Class`, an image folder, an .npz file), else the TFDS builder of that name."""
  from jaxdp.datasets import user
  builder = user.builder_for(name, data_dir, {**kwargs, **extra})
  if builder is not None:
    return builder
  try:
    return tfds.builder(name, data_dir=data_dir, **kwargs, **extra)
  except tfds.core.registered.DatasetNotFoundError:
    raise ConfigError(f"unknown dataset {name!r}: no TFDS builder of that name is registered") from None


def _open(make: Callable[..., tfds.core.DatasetBuilder]) -> tfds.core.DatasetBuilder:
  """`make()`'s builder, prepared once (as ArrayRecord) if it is not yet.

  Every process that found the dataset unprepared reopens it afterwards: a builder made before the
  dataset was prepared (by this process or another) keeps empty splits.
  """
  builder = make()
  if builder.is_prepared() or offline._mocked(builder):
    if offline._mocked(builder):
      builder.download_and_prepare()  # A no-op under tfds.testing.mock_data.
    return builder
  offline.check_can_prepare(builder)  # Fails in seconds, not after minutes of download retries.
  _prepare(make, builder)
  return make()


def _prepare(make: Callable[..., tfds.core.DatasetBuilder], builder: tfds.core.DatasetBuilder) -> None:
  """Prepares the dataset as ArrayRecord under a file lock: one process prepares, the others wait."""
  root = os.fspath(builder.data_dir_root)
  os.makedirs(root, exist_ok=True)
  lock_path = os.path.join(root, f".{builder.name}.prepare.lock")
  with open(lock_path, "w") as lock, contextlib.ExitStack() as stack:
    fcntl.flock(lock, fcntl.LOCK_EX)
    stack.callback(fcntl.flock, lock, fcntl.LOCK_UN)
    fresh = make(file_format=_RANDOM_ACCESS.value)  # Another process may have prepared it meanwhile.
    if not fresh.is_prepared():
      fresh.download_and_prepare()


def _random_access(builder: tfds.core.DatasetBuilder) -> bool:
  return offline._mocked(builder) or _RANDOM_ACCESS in builder.info.available_file_formats()


def _require_random_access(builder: tfds.core.DatasetBuilder) -> None:
  """A dataset prepared as TFRecord only: one line saying how to convert it (or to stream it)."""
  if _random_access(builder):
    return
  formats = ", ".join(sorted(f.value for f in builder.info.available_file_formats())) or "unknown"
  raise ConfigError(
      f"dataset {builder.name!r} is prepared in {str(builder.data_dir)!r} as {formats} only; jaxdp reads "
      f"examples by index from ArrayRecord. Convert it once with `python -m jaxdp.data.convert "
      f"{builder.data_dir}` (or stream it with dataset.shard_by_process=True: batches then depend on the "
      f"process count)")


def train_batches(ds: Dataset, split: str, *, seed: int, global_batch: int, start_step: int,
                  process_index: int, process_count: int) -> Iterator[Batch]:
  """This process's rows of global batches start_step, start_step+1, ... (forever)."""
  rows = global_batch // process_count
  first_row = process_index * rows
  if ds.streamed:
    return _streamed(ds, split, seed, global_batch, start_step, process_index, process_count)
  source = ds.source(split)
  if ds.options.shard_by_process:
    order = _ShardOrder(len(source), rows, seed, split, process_index, process_count)
  else:
    order = sampler.GlobalOrder(len(source), global_batch, seed, split)
  pre = ds.options.preprocess

  def read(step: np.ndarray) -> dict[str, np.ndarray]:
    return source.read(order.rows(step, first_row, first_row + rows))

  def crop(example: dict) -> dict:
    key = images.example_seed(seed, example["step"], example["row"])
    x = images.train_crop(example["inputs"], key, pre.image_size, ds.input_shape[-1], pre.flip)
    return {**example, "inputs": x}

  def finish(batch: dict) -> dict:
    batch = pre.train(batch, batch.pop("step")[0], seed=seed, global_batch=global_batch, first_row=first_row)
    del batch["row"]
    return batch

  steps = tf.data.Dataset.range(start_step, _FOREVER)
  probe = source.read(np.zeros([1], np.int64))
  batches = _read(ds, probe, steps, read, rows, first_row, crop if pre.image_size else None)
  batches = batches.map(_plain(finish), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return iter(tfds.as_numpy(_prefetch(batches, ds.options.prefetch)))


class _ShardOrder:
  """shard_by_process over a random-access source: process p reads its own contiguous 1/P of the split,
  shuffled per epoch by (seed, p); deterministic, but the batches depend on the process count."""

  def __init__(self, n: int, rows: int, seed: int, split: str, process_index: int, process_count: int):
    size = n // process_count  # Equal shards: the same batches per epoch everywhere.
    self.lo = process_index * size
    self.order = sampler.GlobalOrder(size, rows, seed * 1_000_003 + process_index, f"{split} (this process's shard)")

  def rows(self, step: int, lo: int, hi: int) -> np.ndarray:
    del lo, hi  # The whole local batch comes from this process's shard.
    return self.lo + self.order.rows(step, 0, self.order.global_batch)


def _read(ds: Dataset, probe: dict[str, np.ndarray], steps: tf.data.Dataset, read: Callable[[np.ndarray], dict],
          rows: int, first_row: int, per_example: Callable[[dict], dict] | None) -> tf.data.Dataset:
  """step -> this process's `rows` examples, read by index, decoded (and `per_example`'d) in parallel workers.

  `probe`: one row as `read` returns it (its keys, dtypes and shapes). Each element carries "step" and
  "row" (its row in the global batch) for keyed augmentation.
  """
  keys = sorted(probe)
  dtypes = [tf.string if probe[k].dtype == object else tf.as_dtype(probe[k].dtype) for k in keys]

  def read_step(step: tf.Tensor) -> dict:
    arrays = tf.numpy_function(lambda s: [read(s)[k] for k in keys] if len(keys) > 1 else read(s)[keys[0]],
                               [step], dtypes if len(keys) > 1 else dtypes[0], stateful=False)
    arrays = arrays if len(keys) > 1 else [arrays]
    example = {k: tf.ensure_shape(a, [rows, *probe[k].shape[1:]]) for k, a in zip(keys, arrays)}
    return {**example, "step": tf.fill([rows], step), "row": first_row + tf.range(rows, dtype=tf.int64)}

  def decode(example: dict) -> dict:
    decoded = ds.corpus.decode(example) if ds.corpus.decode is not None else example
    out = {"inputs": decoded["inputs"], "labels": decoded["labels"], "step": example["step"],
           "row": example["row"], **({"mask": example["mask"]} if "mask" in example else {})}
    return per_example(out) if per_example is not None else out

  batches = steps.map(_plain(read_step), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  if ds.corpus.decode is None and per_example is None:
    return batches.map(_plain(decode))
  if per_example is None:  # Fixed shapes: decode each step's rows with map_fn (measured 1.5x unbatch + map).
    spec = _decoded_spec(probe, decode)
    return batches.map(_plain(lambda b: tf.map_fn(decode, b, fn_output_signature=spec)),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  examples = batches.unbatch().map(_plain(decode), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return examples.batch(rows, drop_remainder=True)


def _decoded_spec(probe: dict[str, np.ndarray], decode: Callable[[dict], dict]) -> dict[str, tf.TensorSpec]:
  """The type of one decoded row, found by tracing `decode` on the probe's row."""
  one = {k: tf.constant(v[0], tf.string if v.dtype == object else None) for k, v in probe.items()}
  one.update(step=tf.constant(0, tf.int64), row=tf.constant(0, tf.int64))
  outputs = tf.function(decode).get_concrete_function(one).structured_outputs
  return {k: tf.TensorSpec(v.shape, v.dtype) for k, v in outputs.items()}


def _streamed(ds: Dataset, split: str, seed: int, global_batch: int, start_step: int, process_index: int,
              process_count: int) -> Iterator[Batch]:
  """shard_by_process on a TFRecord dataset: this process's own file shards streamed through a shuffle buffer,
  shuffled per epoch; depends on the process count."""
  rows = global_batch // process_count
  first_row = process_index * rows
  shard = tfds.split_for_jax_process(split, process_index=process_index, process_count=process_count,
                                     drop_remainder=True)  # Equal shards: the same batches per epoch everywhere.
  n = ds.builder.info.splits[shard].num_examples
  steps_per_epoch = sampler.steps_per_epoch(n, rows, f"{split} (this process's shard)")
  first_epoch, skip = divmod(start_step, steps_per_epoch)
  pre = ds.options.preprocess
  if pre.image_size:
    raise ConfigError("dataset.shard_by_process does not crop images of varying size; read by index instead")

  def finish(batch: dict, step: tf.Tensor) -> dict:
    return pre.train(batch, step, seed=seed, global_batch=global_batch, first_row=first_row)

  def epoch(e: int) -> Iterator[Batch]:
    epoch_seed = (seed * 1_000_003 + e * 7_919 + process_index) % 2**31
    examples = ds.builder.as_dataset(split=shard, as_supervised=True, shuffle_files=True,
                                     read_config=tfds.ReadConfig(shuffle_seed=epoch_seed))
    examples = examples.map(_plain(lambda x, y: {"inputs": x, "labels": y}))
    examples = examples.shuffle(ds.options.shuffle_buffer, seed=epoch_seed, reshuffle_each_iteration=False)
    batches = examples.batch(rows, drop_remainder=True).take(steps_per_epoch)
    batches = batches.enumerate(start=e * steps_per_epoch).map(_plain(lambda step, b: (b, step)))
    batches = batches.skip(skip if e == first_epoch else 0).map(_plain(finish), num_parallel_calls=tf.data.AUTOTUNE,
                                                                deterministic=True)
    return iter(tfds.as_numpy(_prefetch(batches, ds.options.prefetch)))

  return itertools.chain.from_iterable(map(epoch, itertools.count(first_epoch)))


def _prefetch(batches: tf.data.Dataset, depth: int) -> tf.data.Dataset:
  return batches.prefetch(tf.data.AUTOTUNE if depth == -1 else depth) if depth else batches


def eval_batches(ds: Dataset, split: str, *, global_batch: int, process_index: int,
                 process_count: int) -> Iterator[Batch]:
  """Every example of `split` exactly once, padded to full batches; `mask` marks the real ones."""
  if ds.streamed:
    return _streamed_eval(ds, split, global_batch, process_index, process_count)
  source = ds.source(split)
  n = len(source)
  rows = global_batch // process_count
  lo = process_index * rows
  pre = ds.options.preprocess

  def read(step: np.ndarray) -> dict[str, np.ndarray]:
    # Padding repeats real examples from the start (so they decode like any other) with mask False.
    indices, mask = sampler.eval_rows(n, global_batch, int(step), lo, lo + rows)
    return {**source.read(indices), "mask": mask}

  def crop(example: dict) -> dict:
    return {**example, "inputs": images.eval_crop(example["inputs"], pre.image_size, pre.crop_ratio,
                                                  ds.input_shape[-1])}

  def finish(batch: dict) -> dict:
    return pre.finish({k: v for k, v in batch.items() if k not in ("step", "row")})

  probe = {**source.read(np.zeros([1], np.int64)), "mask": np.ones([1], bool)}
  steps = tf.data.Dataset.range(math.ceil(n / global_batch))
  batches = _read(ds, probe, steps, read, rows, lo, crop if pre.image_size else None)
  batches = batches.map(_plain(finish), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return iter(tfds.as_numpy(_prefetch(batches, ds.options.prefetch)))


def _streamed_eval(ds: Dataset, split: str, global_batch: int, process_index: int,
                   process_count: int) -> Iterator[Batch]:
  """Eval of a TFRecord-only dataset: the split streamed in file order, padded, each process decoding its rows."""
  n = ds.num_examples(split)
  padded = math.ceil(n / global_batch) * global_batch
  examples = ds.builder.as_dataset(split=split, as_supervised=True, shuffle_files=False)
  examples = examples.repeat().take(padded).enumerate()
  examples = examples.map(_plain(lambda i, ex: {"inputs": ex[0], "labels": ex[1], "mask": i < n}))
  rows = global_batch // process_count
  lo = process_index * rows
  local = examples.batch(global_batch).map(_plain(lambda b: {k: v[lo:lo + rows] for k, v in b.items()}))
  return iter(tfds.as_numpy(_prefetch(local.map(_plain(ds.options.preprocess.finish)), ds.options.prefetch)))


def num_eval_steps(ds: Dataset, split: str, global_batch: int) -> int:
  """Global eval batches that cover `split` once."""
  return math.ceil(ds.num_examples(split) / global_batch)


def stream_spec(ds: Dataset, split: str, *, seed: int, global_batch: int, process_count: int) -> dict[str, Any]:
  """What the train batches depend on besides the step: save it with the step, compare on restore.

  The order of examples (dataset and version, source kind, split, seed, global batch) and their
  augmentation (crop_padding, flip, image_size and the crop recipe).
  """
  pre = ds.options.preprocess
  spec = {"dataset": ds.corpus.facts.name, "source": ds.kind, "split": split, "seed": seed,
          "global_batch": global_batch, "shard_by_process": ds.options.shard_by_process,
          "crop_padding": pre.crop_padding, "flip": pre.flip, "image_size": pre.image_size}
  if pre.image_size:
    spec["crop"] = images.RECIPE
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


def _plain(fn):
  """`fn` traced as written: it has no Python control flow on tensors, so autograph would only cost time."""
  return tf.autograph.experimental.do_not_convert(fn)
