"""What `jaxdp.data.load` opens: a `Dataset` (a `Corpus` of random-access splits), and `Options` for its batches."""

import dataclasses
import os
from typing import Any

import jax
import ml_collections
import numpy as np
import tensorflow_datasets as tfds

from jaxdp import config as config_lib
from jaxdp.config import ConfigError
from jaxdp.data.preprocess import Preprocess, batch_dtype
from jaxdp.data.source import INPUTS, Corpus, Source

Batch = dict[str, np.ndarray]
CACHE_AUTO = "auto"  # dataset.cache_mb's default: a budget from the machine's memory (`cache_budget_mib`).
# "auto": at most CACHE_AUTO_MAX_MIB and 1/CACHE_AUTO_SHARE of memory (docs/design-notes.md#input-pipeline-choices).
CACHE_AUTO_MAX_MIB = 1024
CACHE_AUTO_SHARE = 16
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


@dataclasses.dataclass(frozen=True)
class Options:
  """How batches are read and prepared (`config.dataset` fields beyond the dataset's name)."""
  preprocess: Preprocess = Preprocess()
  cache_mb: float | str = CACHE_AUTO  # Splits decoded at most this big (MiB, all together) are decoded once, in memory.
  skip_bad_examples: bool = False  # An example that does not decode is replaced (`bad_examples`), not an error.

  @property
  def cache_budget_mib(self) -> float:
    """`cache_mb` in MiB ("auto" resolved for this machine)."""
    return cache_budget_mib(self.cache_mb)

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, input_shape: tuple[int | None, ...]) -> "Options":
    """Reads and checks the fields of a complete `config.dataset` (`config.with_defaults`)."""
    options = cls(Preprocess.from_config(config, input_shape), config.cache_mb, bool(config.skip_bad_examples))
    options.cache_budget_mib  # A bad value fails now, naming itself.
    return options


def cache_budget_mib(setting: Any) -> float:
  """`dataset.cache_mb` in MiB: a number >= 0 (or its text, from a stored config) as it is; "auto" for this machine."""
  if setting == CACHE_AUTO:
    return min(CACHE_AUTO_MAX_MIB, memory_bytes() / CACHE_AUTO_SHARE / 2**20)
  mib = config_lib.mib(setting)
  if not mib >= 0:  # Also NaN.
    raise ConfigError(f"dataset.cache_mb must be {CACHE_AUTO!r} or a number of MiB >= 0 (0: never), got {setting!r}")
  return mib


def memory_bytes() -> int:
  """The memory this process's machine (or container: its cgroup's limit, when lower) has."""
  total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  for path in _CGROUP_LIMITS:
    try:
      with open(path) as f:
        limit = f.read().strip()
    except OSError:
      continue
    if limit.isdigit():
      total = min(total, int(limit))
  return total


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
  def float_labels(self) -> bool:
    """Whether the labels are float targets (regression), not classes."""
    return self.corpus.facts.float_labels

  def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
    """One example's features as batches hold them (decoded and preprocessed; no batch axis; jaxdp's keys left out)."""
    spec = {}
    for name, (shape, dtype) in self.corpus.facts.decoded().items():
      if name == INPUTS:
        shape = self.input_shape
      spec[name] = jax.ShapeDtypeStruct(tuple(shape), batch_dtype(name, dtype))
    return spec

  def row_bytes(self) -> int:
    """Bytes of one example as batches hold it (every feature of `element_spec`)."""
    return sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in self.element_spec().values())

  @property
  def integer_inputs(self) -> bool:
    """Whether inputs are integer ids (e.g. tokens) that arrive as float32 but must stay exact."""
    return self.corpus.facts.integer_inputs

  def source(self, split: str) -> Source:
    """The split's random-access source (the corpus opens each split once)."""
    return self.corpus.source(split)

  def num_examples(self, split: Any) -> int:
    """Examples in a split spec such as "test" or "train[:90%]"."""
    return len(self.source(split))
