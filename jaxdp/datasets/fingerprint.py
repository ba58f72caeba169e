"""The identity of a local data source (a file or a folder), as the TFDS config name of its prepared copy."""

import dataclasses
import hashlib
import os
import re
from collections.abc import Callable, Iterable

import tensorflow_datasets as tfds

from jaxdp.config import ConfigError


def checked_source(path: str, test_fraction: float, kind: str, exists: Callable[[str], bool]) -> str:
  """The source's absolute path, once it exists and its held-out `test_fraction` is in (0, 1)."""
  if not exists(path):
    raise ConfigError(f"{kind} {path!r} not found")
  if isinstance(test_fraction, bool) or not (isinstance(test_fraction, (int, float)) and 0 < test_fraction < 1):
    raise ConfigError(f"dataset test_fraction must be in (0, 1), got {test_fraction!r}")
  return os.path.abspath(path)


def file_stats(paths: Iterable[str]) -> list[tuple[str, int, int]]:
  """(absolute path, size, mtime in ns) of each file: what its identity is taken from (no content read)."""
  out = []
  for path in paths:
    st = os.stat(path)
    out.append((os.path.abspath(path), st.st_size, st.st_mtime_ns))
  return out


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

