"""What `dataset.name` names, and how each kind of dataset opens: one table of (matcher, opener), and `load`.

The kinds: a token file (`token_file`), a TFDS builder class ("package.module:Class"), an `.npz` file and an image
folder (builders in `jaxdp.datasets`, imported by module path when such a name is opened: this package never
imports `jaxdp.datasets`), and, for any name no kind claims, a TFDS name ("mnist", "mnist:3.0.1"; one of jaxdp's
own, "digits", is its module `jaxdp.datasets.digits`). The matchers are disjoint (a name is claimed by one kind at
most), so no kind depends on the order of the table.
"""

import dataclasses
import importlib
import os
from collections.abc import Callable
from typing import Any

import ml_collections

from jaxdp import config as config_lib
from jaxdp.data import in_memory, tfds_dataset, token_file
from jaxdp.data.dataset import Dataset


@dataclasses.dataclass(frozen=True)
class Kind:
  """A kind of dataset: which names it claims and how it opens them."""
  name: str                                                 # What the name is, for messages ("an image folder").
  matches: Callable[[str], bool]                            # Whether `dataset.name` is of this kind.
  open: Callable[[ml_collections.ConfigDict, dict], Dataset]  # (complete config.dataset, builder_kwargs) -> Dataset.
  make: tfds_dataset.MakeBuilder | None = None              # A TFDS-backed kind's builder maker (`tfds_dataset`).


def tfds_kind(name: str, matches: Callable[[str], bool], make: tfds_dataset.MakeBuilder) -> Kind:
  """A kind whose datasets are TFDS builders made by `make`, opened by `tfds_dataset.open_builder`."""
  return Kind(name, matches, tfds_dataset.opener(make), make)


def is_npz(name: str) -> bool:
  """Whether `name` names an .npz file."""
  return name.lower().endswith(".npz")


def is_folder(name: str) -> bool:
  """Whether `name` means a folder's path rather than a TFDS name (which may contain "/": "name/config")."""
  # A path is absolute or starts with `./`, `../` or `~`, or contains `/` and exists: a bare "mnist" stays the TFDS
  # dataset even when the working directory has a folder of that name (write `./mnist` for the folder).
  return not is_npz(name) and (name.startswith(("/", "./", "../", "~")) or ("/" in name and os.path.exists(name)))


TFDS_NAME = tfds_kind("a registered TFDS name", lambda name: True, tfds_dataset.registered)
KINDS = (  # Every kind but the fallback.
    Kind("a token file", lambda name: name == token_file.NAME, token_file.open_dataset),
    tfds_kind("a TFDS builder class", lambda name: bool(tfds_dataset.CLASS_REF.match(name)), tfds_dataset.by_class),
    Kind("an .npz file", is_npz, lambda config, kwargs: _shipped_module("npz").open_dataset(config, kwargs)),
    tfds_kind("an image folder", is_folder, tfds_dataset.shipped("image_folder")),
)


def _shipped_module(name: str) -> Any:
  """Module `jaxdp.datasets.<name>`, imported when a dataset of its kind opens (this package never imports it)."""
  return importlib.import_module(f"{tfds_dataset.SHIPPED}.{name}")


def find(name: str) -> Kind:
  """The kind that claims `name`: the kind in the table that matches it, else a registered TFDS name."""
  claims = [kind for kind in KINDS if kind.matches(name)]
  if len(claims) > 1:
    raise ValueError(f"dataset name {name!r} is claimed by {', '.join(k.name for k in claims)}: matchers must be "
                     "disjoint")
  return claims[0] if claims else TFDS_NAME


def load(config: ml_collections.ConfigDict, *, train_data: Any = None, eval_data: Any = None) -> Dataset:
  """Opens the dataset `config` (a `config.dataset`) names, preparing it once (as ArrayRecord) if needed; or, given
  `train_data`/`eval_data` (a dict of numpy arrays or a random-access source each), those (`in_memory`; the name
  is then unused).

  Fields it lacks take their defaults from `configs/default.py` (a caller may pass a few fields only).
  """
  config = complete(config)
  if train_data is not None or eval_data is not None:
    return in_memory.open_data(config, train_data, eval_data)
  return find(config.name).open(config, dict(config.get("builder_kwargs") or {}))


def complete(dataset: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`dataset` (a `config.dataset`) with every field it lacks from `configs/default.py`."""
  return config_lib.with_defaults(ml_collections.ConfigDict({"dataset": dataset})).dataset

