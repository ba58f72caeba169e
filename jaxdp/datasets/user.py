"""Your own data as `dataset.name`, without registering a TFDS builder first.

`builder_for(name, data_dir, builder_kwargs)` resolves, in this order:
  - a name ending in `.npz` -> `npz.NpzFile` (numpy arrays);
  - a path to a folder -> `image_folder.ImageFolder` (class subfolders of images). A path is absolute or
    starts with `./`, `../` or `~`, or contains `/` and exists: a bare "mnist" stays the TFDS dataset even
    when the working directory has a folder of that name (write `./mnist` for the folder);
  - "package.module:Builder" -> that TFDS builder class, imported and instantiated;
and returns None for anything else (a registered TFDS name such as "mnist" or "mnist:3.*.*").
Every builder it returns prepares ArrayRecord (`file_format="array_record"`), so the random-access
input path reads it like any other dataset.
"""

import importlib
import inspect
import os
import re

import tensorflow_datasets as tfds
from tensorflow_datasets.core import dataset_builder

from jaxdp.config import ConfigError
from jaxdp.datasets import image_folder, npz

FILE_FORMAT = "array_record"
# "package.module:ClassName"; a TFDS name with a version ("mnist:3.0.1", "mnist/config:3.*.*") does not match.
_CLASS_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def builder_for(name: str, data_dir: str | None, builder_kwargs: dict,
                skip_bad: bool = False) -> tfds.core.DatasetBuilder | None:
  """The builder of a user's dataset named by path or "module:Builder"; None for a registered TFDS name.

  `skip_bad`: an image folder leaves out the files that do not decode (`image_folder`), instead of failing.
  """
  kwargs = {"data_dir": data_dir, "file_format": FILE_FORMAT, **dict(builder_kwargs or {})}
  if name.lower().endswith(".npz"):
    return npz.NpzFile(path=os.path.expanduser(name), **kwargs)  # Reports a missing file by name.
  if _is_path(name):
    return image_folder.ImageFolder(path=os.path.expanduser(name), skip_bad=skip_bad, **kwargs)  # Reports a missing folder by name.
  if _CLASS_REF.match(name):
    return _instantiate(name, _builder_class(name), kwargs)
  return None


def _is_path(name: str) -> bool:
  """Whether `name` means a file system path rather than a TFDS name (which may contain "/": "name/config")."""
  return name.startswith(("/", "./", "../", "~")) or ("/" in name and os.path.exists(name))


def _builder_class(name: str) -> type[tfds.core.DatasetBuilder]:
  """The TFDS builder class named by "package.module:ClassName"."""
  module_name, _, class_name = name.partition(":")
  try:
    cls = getattr(importlib.import_module(module_name), class_name)
  except ImportError as e:
    raise ConfigError(f"dataset {name!r}: cannot import module {module_name!r}: {e}") from None
  except AttributeError:
    raise ConfigError(f"dataset {name!r}: module {module_name!r} has no {class_name!r}") from None
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
