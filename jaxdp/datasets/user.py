"""Your own data as `dataset.name`, without registering a TFDS builder first: the kinds that live here, registered
with `jaxdp.data.kinds` when this package is imported.

  - a name ending in `.npz` -> `npz.open_dataset` (numpy arrays, held in memory);
  - a path to a folder -> `image_folder.ImageFolder` (class subfolders of images). A path is absolute or
    starts with `./`, `../` or `~`, or contains `/` and exists: a bare "mnist" stays the TFDS dataset even
    when the working directory has a folder of that name (write `./mnist` for the folder).
("package.module:Builder", a TFDS builder class, is `jaxdp.data.tfds_dataset.by_class`.) An image folder's builder
prepares ArrayRecord (`file_format="array_record"`), so the random-access input path reads it like any other.
"""

import os

import tensorflow_datasets as tfds

from jaxdp.data import kinds, tfds_dataset
from jaxdp.datasets import image_folder, npz


def is_folder(name: str) -> bool:
  """Whether `name` means a folder's path rather than a TFDS name (which may contain "/": "name/config")."""
  return not npz.is_npz(name) and (name.startswith(("/", "./", "../", "~")) or ("/" in name and os.path.exists(name)))


def folder(name: str, data_dir: str | None, kwargs: dict, skip_bad: bool = False,
           **extra) -> tfds.core.DatasetBuilder:
  """The builder of the image folder `name`; `skip_bad`: it leaves out the files that do not decode."""
  return image_folder.ImageFolder(path=os.path.expanduser(name), skip_bad=skip_bad,
                                  **tfds_dataset.user_kwargs(data_dir, kwargs, extra))


NPZ = kinds.register(kinds.Kind("an .npz file", npz.is_npz, npz.open_dataset))
FOLDER = kinds.register(kinds.tfds_kind("an image folder", is_folder, folder))
