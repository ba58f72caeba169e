"""A TFDS builder as a `Dataset`: prepared once as ArrayRecord (`prepare`), read by index through a `TfdsCorpus`,
decoded once in memory when small (`cache`). The builder comes from a kind's maker (`kinds`): a registered
TFDS name, a builder class named "package.module:Class", or a user's file or folder (`jaxdp.datasets.npz`,
`jaxdp.datasets.image_folder`).
"""

import importlib
import importlib.util
import inspect
import re
from collections.abc import Callable

import ml_collections
import tensorflow_datasets as tfds
from tensorflow_datasets.core import dataset_builder

from jaxdp import config as config_lib
from jaxdp.config import ConfigError
from jaxdp.data import cache, prepare
from jaxdp.data.dataset import Dataset, Options
from jaxdp.data.source import FeatureNames, TfdsCorpus
from jaxdp.runtime import quiet

# (name, data_dir, builder_kwargs, skip_bad, **extra) -> the builder; `extra` (e.g. file_format) is TFDS's.
MakeBuilder = Callable[..., tfds.core.DatasetBuilder]
FILE_FORMAT = "array_record"  # What a user's builder prepares, so that it reads by index like any other.
# "package.module:ClassName"; a TFDS name with a version ("mnist:3.0.1", "mnist/config:3.*.*") does not match.
CLASS_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
SHIPPED = "jaxdp.datasets"  # The package of jaxdp's own builders, a module each, named as the dataset.


def opener(make: MakeBuilder) -> Callable[[ml_collections.ConfigDict, dict], Dataset]:
  """A kind's opener from its builder maker: (config.dataset, builder_kwargs) -> the prepared `Dataset`."""
  return lambda config, kwargs: open_builder(config, kwargs, make)


def open_builder(config: ml_collections.ConfigDict, kwargs: dict, make: MakeBuilder) -> Dataset:
  """The dataset of `make`'s builder, preparing it once (as ArrayRecord) if needed."""
  skip_bad = bool(config.skip_bad_examples)
  with quiet.tfds_prints():  # TFDS prints "Downloading and preparing ..." for every dataset it prepares.
    builder = prepare.open_prepared(lambda **extra: make(config.name, config.data_dir, kwargs, skip_bad, **extra))
  names = FeatureNames(builder.info)  # A dataset without supervised keys gives all its features, no inputs.
  input_shape = tuple(builder.info.features[names.input_key].shape) if names.input_key is not None else ()
  options = Options.from_config(config, input_shape)
  prepare.require_random_access(builder)
  corpus = TfdsCorpus(builder, keep_encoded=bool(options.preprocess.image_size))
  return Dataset(cache.maybe_cached(corpus, options.cache_budget_mib), options, builder)


def registered(name: str, data_dir: str | None, kwargs: dict, skip_bad: bool = False,
               **extra) -> tfds.core.DatasetBuilder:
  """The TFDS builder registered as `name` ("mnist", "mnist:3.0.1", "cifar10/plain:3.*.*")."""
  del skip_bad  # Only an image folder leaves bad files out when preparing.
  module = re.split(r"[/:]", name)[0]
  if module.isidentifier() and importlib.util.find_spec(f"{SHIPPED}.{module}") is not None:
    importlib.import_module(f"{SHIPPED}.{module}")  # jaxdp's own builder: defining its class registers it with TFDS.
  try:
    return tfds.builder(name, data_dir=data_dir, **kwargs, **extra)
  except tfds.core.registered.DatasetNotFoundError:
    raise ConfigError(f"unknown dataset {name!r}: no TFDS builder of that name is registered") from None


def shipped(module: str) -> MakeBuilder:
  """The builder maker `make` of module `jaxdp.datasets.<module>`, imported when a dataset of its kind opens."""
  return lambda *args, **kwargs: importlib.import_module(f"{SHIPPED}.{module}").make(*args, **kwargs)


def user_kwargs(data_dir: str | None, kwargs: dict, extra: dict) -> dict:
  """A user's builder's keyword arguments: the data_dir, ArrayRecord, the builder_kwargs, TFDS's extras."""
  return {"data_dir": data_dir, "file_format": FILE_FORMAT, **dict(kwargs or {}), **extra}


def by_class(name: str, data_dir: str | None, kwargs: dict, skip_bad: bool = False,
             **extra) -> tfds.core.DatasetBuilder:
  """The TFDS builder class named by "package.module:ClassName", imported and instantiated."""
  del skip_bad  # Only an image folder leaves bad files out when preparing.
  return _instantiate(name, _builder_class(name), user_kwargs(data_dir, kwargs, extra))


def _builder_class(name: str) -> type[tfds.core.DatasetBuilder]:
  """The TFDS builder class named by "package.module:ClassName"."""
  cls = config_lib.import_named(name, "dataset")
  if not (inspect.isclass(cls) and issubclass(cls, tfds.core.DatasetBuilder)):
    raise ConfigError(f"dataset {name!r} is not a TFDS builder class (tfds.core.DatasetBuilder), got {cls!r}")
  return cls


def _instantiate(name: str, cls: type[tfds.core.DatasetBuilder], kwargs: dict) -> tfds.core.DatasetBuilder:
  if missing := sorted(getattr(cls, "__abstractmethods__", ())):  # Else Python's TypeError reads as bad kwargs.
    raise ConfigError(f"dataset {name!r} does not define {', '.join(missing)} (a TFDS builder must: see "
                      f"tfds.core.GeneratorBasedBuilder)")
  if not issubclass(cls, dataset_builder.FileReaderBuilder):
    kwargs.pop("file_format")  # A builder that does not write record files takes no file format.
  try:
    return cls(**kwargs)
  except TypeError as e:  # Wrong builder_kwargs for the class (or an abstract class): a config mistake.
    raise ConfigError(f"dataset {name!r} does not accept the builder_kwargs {sorted(kwargs)}: {e}") from None
