"""The identity of a local data source (a file or a folder), as a TFDS builder config name.

Prepared copies live under DATA_DIR/BUILDER/CONFIG/VERSION; the config name holds a digest of the
source's absolute path, of the size and modification time of every file in it, and of the options
that change the prepared examples. So two sources never share a prepared copy, and a changed file (or
option) is prepared anew instead of a stale copy being reused.
"""

import dataclasses
import hashlib
import os
import re
from collections.abc import Callable, Iterable
from typing import ClassVar

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
  """'<stem>-<12 hex digits>': readable, and unique to the source's path, files and options."""
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


class SourceBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A TFDS builder of one local source; its config is named by the source's identity (`config_name`)."""

  KIND: ClassVar[str] = "source"  # How errors and descriptions name it: "image folder", ".npz file".

  def __init__(self, *, path: str, test_fraction: float = 0.1, **kwargs):
    path = checked_source(path, test_fraction, self.KIND, self._exists)
    files = self._open(path, test_fraction)
    self._test_fraction = test_fraction
    name = config_name(path, file_stats(files), self._options())
    kwargs["config"] = SourceConfig(name=name, path=path, test_fraction=test_fraction, description=f"{self.KIND} {path}")
    super().__init__(**kwargs)

  def _options(self) -> dict:
    """The options that change the prepared examples (part of the config name)."""
    return {"test_fraction": self._test_fraction}

  @staticmethod
  def _exists(path: str) -> bool:
    """Whether the source is there (a folder or a file, as the builder reads)."""
    raise NotImplementedError

  def _open(self, path: str, test_fraction: float) -> list[str]:
    """Reads and checks what the builder needs from the source; returns the files its identity covers."""
    raise NotImplementedError
