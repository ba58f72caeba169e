"""A folder of class subfolders of images as a TFDS dataset (its labels, splits, shapes, bad files: docs/data.md)."""

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds

from jaxdp.config import ConfigError
from jaxdp.data import source, tfds_dataset
from jaxdp.datasets import fingerprint

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
SPLIT_DIRS = ("train", "test", "validation")
KEEP_BYTES = {"JPEG", "PNG"}  # Formats stored as they are (when their mode is the stored one).
log = logging.getLogger("jaxdp")


def make(name: str, data_dir: str | None, kwargs: dict, skip_bad: bool = False, **extra) -> tfds.core.DatasetBuilder:
  """The builder of the image folder `name` (a `kinds` maker); `skip_bad`: it leaves out files that do not decode."""
  return ImageFolder(path=os.path.expanduser(name), skip_bad=skip_bad,
                     **tfds_dataset.user_kwargs(data_dir, kwargs, extra))


def list_files(root: str, test_fraction: float) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
  """(class names, split -> [(image path, label)]) of a folder, in a fixed order."""
  subdirs = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))
  split_dirs = [d for d in subdirs if d in SPLIT_DIRS]
  if split_dirs:
    per_split = {s: _class_files(os.path.join(root, s)) for s in split_dirs}
    classes = sorted({c for files in per_split.values() for c in files})
    splits = {s: [(p, classes.index(c)) for c in sorted(files) for p in files[c]] for s, files in per_split.items()}
  else:
    files = _class_files(root)
    classes = sorted(files)
    splits = {"train": [], "test": []}
    for label, c in enumerate(classes):  # By each file's own path digest (`in_test`).
      for p in files[c]:
        splits["test" if in_test(os.path.relpath(p, root), test_fraction) else "train"].append((p, label))
  if not classes or not any(splits.values()):
    raise ConfigError(f"image folder {root!r} has no class subfolders of images ({', '.join(EXTENSIONS)})")
  return classes, {s: v for s, v in splits.items() if v}


def _class_files(folder: str) -> dict[str, list[str]]:
  """class name -> sorted image paths under folder/class (recursively)."""
  out = {}
  for c in sorted(os.listdir(folder)):
    top = os.path.join(folder, c)
    if c.startswith(".") or not os.path.isdir(top):
      continue
    paths = [os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs
             if f.lower().endswith(EXTENSIONS) and not f.startswith(".")]
    out[c] = sorted(paths)
  return out


def in_test(relpath: str, test_fraction: float) -> bool:
  """Whether a file goes to `test`: its path's digest, read as a fraction of 2**64, is below test_fraction."""
  # Only the file's own path decides (never its rank among others), so adding files moves none.
  digest = int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:8], "big")
  return digest / 2**64 < test_fraction


def image_shape(paths: list[str]) -> tuple[tuple[int | None, int | None, int], list[str]]:
  """((H, W, C) of the images that open: None where sizes differ, C 1 if all are gray, else 3), and the others."""
  from PIL import Image  # Reads headers only (lazy decoding).
  sizes, gray, unreadable = set(), True, []
  for path in paths:
    try:
      with Image.open(path) as im:
        sizes.add(im.size)
        gray = gray and im.mode in ("L", "1", "I;16", "I")
    except (OSError, ValueError, SyntaxError):  # PIL's UnidentifiedImageError is an OSError.
      unreadable.append(path)
  (w, h), = sizes if len(sizes) == 1 else {(None, None)}
  return (h, w, 1 if gray else 3), unreadable


def bad_file_error(root: str, path: str, why: str) -> ConfigError:
  """The one-line error for a file that is not a whole image."""
  return ConfigError(f"image folder {root!r}: {os.path.relpath(path, root)!r} is not a readable image ({why}); "
                     f"remove or replace it, or set dataset.skip_bad_examples=True to leave bad files out")


class ImageFolder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """The images of one folder; its prepared copy is named by the folder's identity (`fingerprint.config_name`)."""

  name = "image_folder"
  KIND = "image folder"
  # A prepared copy is reused by version: a change of which files go where needs a new one.
  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.0.0": "Labels = sorted subfolders; train/test subfolders or a per-class path-digest split.",
                   "1.1.0": "The split by each file's own digest: a file keeps its split when others are added."}

  def __init__(self, *, path: str, test_fraction: float = 0.1, skip_bad: bool = False, **kwargs):
    """`skip_bad`: leave out files that do not decode (counted in a warning) instead of failing on the first."""
    path = fingerprint.checked_source(path, test_fraction, self.KIND, os.path.isdir)
    self._skip_bad = skip_bad
    self._left_out: set[str] = set()  # Files that do not open (known once `info` is built), with skip_bad.
    self._classes, self._splits = list_files(path, test_fraction)
    paths = sorted(p for split in self._splits.values() for p, _ in split)
    # skip_bad only when on: the prepared copies made before the option existed keep their names.
    options = {"test_fraction": test_fraction, **({"skip_bad": True} if skip_bad else {})}
    name = fingerprint.config_name(path, source.file_stats(paths), options)
    kwargs["config"] = fingerprint.SourceConfig(name=name, path=path, test_fraction=test_fraction,
                                                description=f"{self.KIND} {path}")
    super().__init__(**kwargs)

  def _shape(self) -> tuple[int | None, int | None, int]:
    """The images' shape (`image_shape`), cached beside the prepared copy; files that do not open fail here."""
    cache = os.path.join(os.fspath(self.data_dir_root), self.name, f".{self.builder_config.name}.scan.json")
    try:  # The copy's name already covers every file.
      with open(cache) as f:
        shape, unreadable = json.load(f)
    except (OSError, ValueError):
      shape, unreadable = image_shape([p for files in self._splits.values() for p, _ in files])
      tmp = f"{cache}.{os.getpid()}.tmp"  # One per process: several may scan the same folder at once.
      with contextlib.suppress(OSError):  # A read-only data_dir: scan again next time.
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        with open(tmp, "w") as f:
          json.dump([shape, unreadable], f)
        os.replace(tmp, cache)  # Atomic: readers see a whole file or none.
    if unreadable and not self._skip_bad:
      raise bad_file_error(self.builder_config.path, unreadable[0], "it does not open as an image")
    self._left_out = set(unreadable)
    return tuple(shape)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=f"Class subfolders of images in {self.builder_config.path}.",
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=self._shape()),
            "label": tfds.features.ClassLabel(names=self._classes),
        }),
        supervised_keys=("image", "label"),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
    del dl_manager  # Local files.
    return {split: self._generate_examples(files) for split, files in self._splits.items()}

  def _generate_examples(self, files: list[tuple[str, int]]) -> Iterator[tuple[str, dict]]:
    channels, root = self.info.features["image"].shape[-1], self.builder_config.path
    left_out = [p for p, _ in files if p in self._left_out]
    for path, label in files:
      if path in self._left_out:
        continue
      try:
        image = _encoded(path, channels)
      except (OSError, ValueError, SyntaxError) as e:  # Truncated or corrupt: PIL fails while decoding.
        if not self._skip_bad:
          raise bad_file_error(root, path, str(e) or type(e).__name__) from None
        left_out.append(path)
        continue
      yield os.path.relpath(path, root), {"image": image, "label": label}
    if left_out:
      log.warning("image folder %s: left out %d file(s) that are not readable images (dataset.skip_bad_examples): "
                  "%s", root, len(left_out), ", ".join(os.path.relpath(p, root) for p in sorted(left_out)))


def _encoded(path: str, channels: int) -> bytes | np.ndarray:
  """The file's bytes when TFDS can store them as they are, else the pixels in the stored color mode."""
  # Decodes the whole image either way: a truncated file fails here, once, not in a training step.
  from PIL import Image
  mode = "L" if channels == 1 else "RGB"
  with Image.open(path) as im:
    im.load()
    if im.format in KEEP_BYTES and im.mode == mode:
      with open(path, "rb") as f:
        return f.read()
    pixels = np.asarray(im.convert(mode))
  return pixels[..., None] if channels == 1 else pixels
