"""The identity a random-access source has of its own, which its digest (the resume guard's) takes instead of a
sample of its rows: a Hugging Face dataset's `_fingerprint` (it changes with every change of its content), or the
absolute paths, sizes and modification times of the files a source names in `paths` or `filenames`."""

import os
from typing import Any


def identity(source: Any) -> str | None:
  """The source's own identity as text, or None where it has none (then its rows are sampled)."""
  own = getattr(source, "_fingerprint", None) or getattr(source, "fingerprint", None)
  if isinstance(own, str):
    return own
  files = next((v for v in map(lambda a: getattr(source, a, None), ("paths", "filenames")) if _paths(v)), None)
  if files is None:
    return None
  try:
    stats = [(os.path.abspath(p), os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in map(os.fspath, files)]
  except OSError:  # A named file is not there (a remote path): the rows are sampled instead.
    return None
  return repr(stats)


def _paths(value: Any) -> bool:
  """Whether `value` is a non-empty list of file paths."""
  return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(p, (str, os.PathLike)) for p in value)
