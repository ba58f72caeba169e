"""What the trainer opens: `load(config)` -> a `Dataset` (a `Corpus` of random-access splits, the facts the
trainer needs, and `Options`: how its batches are read and prepared)."""

import dataclasses
import hashlib
import json
import os
from typing import Any

import ml_collections
import numpy as np
import tensorflow_datasets as tfds

from jaxdp.runtime import quiet
from jaxdp.config import ConfigError
from jaxdp.data import cache, prepare
from jaxdp.data.preprocess import Preprocess
from jaxdp.data.source import ArrayCorpus, Corpus, Facts, Source, TfdsCorpus

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Options:
  """How batches are read and prepared (`config.dataset` fields beyond the dataset's name)."""
  preprocess: Preprocess = Preprocess()
  shard_by_process: bool = False
  shuffle_buffer: int = 16_384
  prefetch: int = 2
  max_memory_gb: float = 16.0  # Accepted for old configs; random access holds no split in memory.
  cache_mb: float = 64.0       # Splits decoded at most this big (all together) are decoded once, in memory.
  skip_bad_examples: bool = False  # An example that does not decode is replaced (`bad_examples`), not an error.

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, input_shape: tuple[int | None, ...]) -> "Options":
    """Reads and checks the fields; missing ones keep their defaults."""
    d = cls()
    options = cls(Preprocess.from_config(config, input_shape), bool(config.get("shard_by_process", False)),
                  config.get("shuffle_buffer", d.shuffle_buffer), config.get("prefetch", d.prefetch),
                  config.get("max_memory_gb", d.max_memory_gb), config.get("cache_mb", d.cache_mb),
                  bool(config.get("skip_bad_examples", False)))
    if not isinstance(options.shuffle_buffer, int) or options.shuffle_buffer < 1:
      raise ConfigError(f"dataset.shuffle_buffer must be a positive integer, got {options.shuffle_buffer!r}")
    if isinstance(options.cache_mb, bool) or not isinstance(options.cache_mb, (int, float)) or options.cache_mb < 0:
      raise ConfigError(f"dataset.cache_mb must be a number of MiB >= 0 (0: never), got {options.cache_mb!r}")
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
    """The split's random-access source (the corpus opens each split once)."""
    return self.corpus.source(split)

  @property
  def streamed(self) -> bool:
    """Read as a stream (shard_by_process on a dataset prepared as TFRecord only), not by index."""
    return self.options.shard_by_process and self.builder is not None and not prepare.random_access(self.builder)

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
  skip_bad = bool(config.get("skip_bad_examples", False))
  with quiet.tfds_prints():  # TFDS prints "Downloading and preparing ..." for every dataset it prepares.
    builder = prepare.open_prepared(
        lambda **extra: prepare.make_builder(config.name, config.data_dir, kwargs, skip_bad, **extra))
  if not builder.info.supervised_keys:
    raise ConfigError(f"dataset {config.name!r} has no supervised keys (input, label)")
  input_key = builder.info.supervised_keys[0]
  _check_class_labels(config.name, builder)
  options = Options.from_config(config, tuple(builder.info.features[input_key].shape))
  if not options.shard_by_process:
    prepare.require_random_access(builder)
  corpus = TfdsCorpus(builder, keep_encoded=bool(options.preprocess.image_size))
  if prepare.random_access(builder):
    splits = {name: int(info.num_examples) for name, info in builder.info.splits.items()}
    corpus = cache.maybe_cached(corpus, splits, options.cache_mb)
  return Dataset(corpus, options, builder)


def _check_class_labels(name: str, builder: tfds.core.DatasetBuilder) -> None:
  """A ConfigError for float labels: the step trains classification (integer classes), and a float label
  has no class count (the model was then built with 0 outputs and failed deep inside Flax)."""
  label_key = builder.info.supervised_keys[1]
  dtype = np.dtype(getattr(builder.info.features[label_key], "np_dtype", np.int64))
  if np.issubdtype(dtype, np.floating):
    raise ConfigError(f"dataset {name!r}: its label feature {label_key!r} is {dtype}, not classes: jaxdp trains "
                      f"classification on integer class labels (e.g. tfds.features.ClassLabel)")


def _token_file(config: ml_collections.ConfigDict, kwargs: dict) -> Dataset:
  """A flat token file (`jaxdp.datasets.token_file`): windows read by index, nothing to decode."""
  from jaxdp.datasets import token_file
  splits = token_file.splits(**kwargs)
  train = splits["train"]
  digest = hashlib.sha256(json.dumps({k: s.spec() for k, s in splits.items()}, sort_keys=True).encode())
  facts = Facts(f"token_file:{os.path.basename(train.path)}@{digest.hexdigest()[:12]}", train.input_shape,
                train.input_shape, train.num_classes, integer_inputs=True)
  return Dataset(ArrayCorpus(facts, splits), Options.from_config(config, facts.input_shape), kind="token_file")
