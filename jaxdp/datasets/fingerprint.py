"""The identity of a local data source (a file or a folder), as the TFDS config name of its prepared copy."""

import dataclasses
import hashlib
import os
import re
from collections.abc import Callable

import tensorflow_datasets as tfds

from jaxdp.config import ConfigError
from jaxdp.data import arrays


def checked_source(path: str, test_fraction: float, kind: str, exists: Callable[[str], bool]) -> str:
  """The source's absolute path, once it exists and its held-out `test_fraction` is in (0, 1)."""
  if not exists(path):
    raise ConfigError(f"{kind} {path!r} not found")
  arrays.check_fraction(test_fraction)
  return os.path.abspath(path)


def config_name(source: str, stats: list[tuple[str, int, int]], options: dict) -> str:
  """'<stem>-<12 hex digits>': unique to the source's path, files and options, so a changed one is prepared anew."""
  h = hashlib.sha256(os.path.abspath(source).encode())
  for path, size, mtime in stats:
    h.update(f"\0{path}\0{size}\0{mtime}".encode())
  h.update(repr(sorted(options.items())).encode())
  base = os.path.basename(os.path.normpath(source))
  stem = re.sub(r"[^\w\-]", "_", os.path.splitext(base)[0])[:40] or "data"
  return f"{stem}-{h.hexdigest()[:12]}"


@dataclasses.dataclass
class SourceConfig(tfds.core.BuilderConfig):
  """Which source, and how much of it is held out for `test`."""
  path: str = ""
  test_fraction: float = 0.1

