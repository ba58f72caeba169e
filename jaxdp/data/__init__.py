"""The input pipeline: random-access splits -> one seeded global order -> this process's rows as numpy batches."""

import dataclasses
import importlib
import os
from collections.abc import Callable
from typing import Any

import ml_collections

from jaxdp import config as config_lib
from jaxdp.data import arrays, tfds_dataset
from jaxdp.data.bad_examples import BadExampleError, ReadError, skipped_through
from jaxdp.data.dataset import CACHE_AUTO, Batch, Dataset, Options
from jaxdp.data.source import TfdsCorpus
from jaxdp.data.stream import check_resume, eval_batches, num_eval_steps, on_host, stream_spec, train_batches

__all__ = ["BadExampleError", "Batch", "Dataset", "Options", "ReadError", "check_resume", "decoded_by", "eval_batches",
           "load", "num_eval_steps", "skipped_through", "stream_spec", "train_batches"]


@dataclasses.dataclass(frozen=True)
class Kind:
  """A kind of dataset: which names it claims and how it opens them."""
  name: str                                                 # What the name is, for messages ("an image folder").
  matches: Callable[[str], bool]                            # Whether `dataset.name` is of this kind.
  open: Callable[[ml_collections.ConfigDict, dict], Dataset]  # (complete config.dataset, builder_kwargs) -> Dataset.
  make: tfds_dataset.MakeBuilder | None = None              # A TFDS-backed kind's builder maker.


def tfds_kind(name: str, matches: Callable[[str], bool], make: tfds_dataset.MakeBuilder) -> Kind:
  """A kind whose datasets are TFDS builders made by `make`."""
  return Kind(name, matches, lambda config, kwargs: tfds_dataset.open_builder(config, kwargs, make), make)


def is_npz(name: str) -> bool:
  """Whether `name` names an .npz file."""
  return name.lower().endswith(".npz")


def is_folder(name: str) -> bool:
  """Whether `name` is a folder's path, not a TFDS name: a bare "mnist" stays TFDS's even beside a folder "mnist"."""
  return not is_npz(name) and (name.startswith(("/", "./", "../", "~")) or ("/" in name and os.path.exists(name)))


# The kinds a name may be, disjoint (a name is claimed by one at most); a name none claims is a registered TFDS name.
TFDS_NAME = tfds_kind("a registered TFDS name", lambda name: True, tfds_dataset.registered)
KINDS = (
    Kind("a token file", lambda name: name == arrays.TOKEN_FILE, arrays.open_token_file),
    tfds_kind("a TFDS builder class", lambda name: bool(tfds_dataset.CLASS_REF.match(name)), tfds_dataset.by_class),
    Kind("an .npz file", is_npz,  # By module path: `data` never imports `datasets` by name.
         lambda *args: importlib.import_module(f"{tfds_dataset.SHIPPED}.npz").open_dataset(*args)),
    tfds_kind("an image folder", is_folder, tfds_dataset.shipped("image_folder")),
)


def find(name: str) -> Kind:
  """The kind in `KINDS` that claims `name`, else a registered TFDS name."""
  return next((kind for kind in KINDS if kind.matches(name)), TFDS_NAME)


def load(config: ml_collections.ConfigDict, *, train_data: Any = None, eval_data: Any = None) -> Dataset:
  """The dataset `config` (a `config.dataset`) names, prepared once; or `train_data`/`eval_data` (arrays or sources)."""
  config = config_lib.with_defaults(ml_collections.ConfigDict({"dataset": config})).dataset
  if train_data is not None or eval_data is not None:
    return arrays.open_data(config, train_data, eval_data)
  return find(config.name).open(config, dict(config.get("builder_kwargs") or {}))


def decoded_by(ds: Dataset) -> str | None:
  """None when numpy makes the batches of `ds` on the host; else why tf.data decodes them."""
  if on_host(ds):
    return None
  mib = ds.corpus.decoded_mib() if isinstance(ds.corpus, TfdsCorpus) else None
  if mib is None:  # Varying shapes, images cropped per example, or not a TFDS corpus: never held decoded.
    return "batches decoded by tf.data"
  setting, budget = ds.options.cache_mb, ds.options.cache_budget_mib
  size = f"{mib:,.{0 if mib >= 10 else 1}f} MiB"
  if not budget:
    return f"batches decoded by tf.data: dataset.cache_mb={setting} (its splits take {size} decoded)"
  here = f" ({budget:,.0f} MiB here)" if setting == CACHE_AUTO else " MiB"
  return (f"batches decoded by tf.data: its splits take {size} decoded, more than dataset.cache_mb={setting}{here} "
          "holds in memory")
