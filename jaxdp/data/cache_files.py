"""A split held decoded (`jaxdp.data.cache`) kept on disk beside its prepared files, and memory-mapped.

Decoding a whole split is seconds of a run's start, paid again by every process and every restart, and each
process held its own copy (docs/design-notes.md#input-pipeline-choices). So the first process to open a split decodes it and writes one `.npy` file per feature and a `.json` of what
they hold under `<the prepared dataset's folder>/jaxdp_decoded/<split>/`; every later open, in any process of the host
and any later run, maps those files: no decode, and one copy in the page cache for all of a host's processes.
The same bytes as a decode in memory (tested), so batches and stream specs do not change.

One process of a host writes at a time (a file lock, as preparing the dataset does); the others wait for it
and map what it wrote. Files are written under temporary names and renamed, the `.json` last, so a run killed
while writing leaves nothing that is read. The files' names carry a digest of the prepared split's files
(names, sizes, modification times) and of the decoded features, so a dataset prepared again is decoded again.
A folder that cannot be written (read-only, full, not local) leaves the split decoded in memory, as before.
"""

import contextlib
import fcntl
import glob
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from jaxdp.data.source import Rows

log = logging.getLogger("jaxdp")
FOLDER = "jaxdp_decoded"
FORMAT = 1  # The files' layout; part of their names, so another layout never reads them.
Decoded = tuple[Rows, dict[int, str]]  # The split's arrays, and its examples that do not decode ({index: why}).


def identity(split: str, files: list[str], features: dict[str, tuple[tuple[int, ...], np.dtype]]) -> str:
  """A digest of what the decoded split depends on: its prepared files (name, size, mtime) and decoded features."""
  stats = [(os.path.basename(f), os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in sorted(files)]
  facts = sorted((k, list(shape), np.dtype(dtype).str) for k, (shape, dtype) in features.items())
  return hashlib.sha256(json.dumps([FORMAT, split, stats, facts]).encode()).hexdigest()[:16]


def load_or_decode(folder: str, split: str, digest: str, decode: Callable[[], Decoded]) -> Decoded:
  """The split mapped from its files under `folder` when they are there, else `decode()`d and written there first.

  Decodes in memory, without files, when `folder` is not a local folder; also, with one warning, when it
  cannot be written."""
  if not os.path.isdir(folder):  # Not local (gs://...), or not there: nothing to map.
    return decode()
  here = os.path.join(folder, FOLDER, split)
  stem = os.path.join(here, f"v{FORMAT}-{digest}")
  with contextlib.ExitStack() as stack:
    try:
      stack.enter_context(_locked(here))
    except OSError as e:  # Files written by another (complete ones are only ever renamed into place) still map.
      if (found := read(stem)) is not None:
        return found
      log.warning("dataset split %r is decoded in memory: cannot write its decoded copy in %s (%s)", split, here,
                  e.strerror or e)
      return decode()
    if (found := read(stem)) is not None:
      return found
    arrays, bad = decode()
    try:
      _write(stem, arrays, bad)
    except (OSError, ValueError) as e:  # A full disk; a feature numpy cannot save without pickling.
      log.warning("dataset split %r is decoded in memory: writing its decoded copy in %s failed (%s)", split, here,
                  getattr(e, "strerror", None) or e)  # A ValueError has no strerror.
      # Its own complete files too: without their .json nothing reads them, and each may be a feature's size.
      _remove(p for p in glob.glob(os.path.join(glob.escape(here), "*")) if ".tmp-" in p or p.startswith(stem + "."))
      return arrays, bad
    return read(stem) or (arrays, bad)  # Mapped: this process's decoded copy is released.


@contextlib.contextmanager
def _locked(folder: str) -> Iterator[None]:
  """Holds the folder's lock (one writer per host; released by the kernel if the process dies)."""
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, ".lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def read(stem: str) -> Decoded | None:
  """The split's arrays mapped read-only from `stem`'s files, and its bad examples; None when any is missing,
  incomplete or not as its `.json` says."""
  try:
    with open(f"{stem}.json") as f:
      meta = json.load(f)
    arrays = {k: _mapped(f"{stem}.{i}.npy", meta["rows"], spec) for i, (k, spec) in enumerate(meta["features"].items())}
    return arrays, {int(i): why for i, why in meta["bad"].items()}
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _mapped(path: str, rows: int, spec: dict) -> np.ndarray:
  """The `.npy` file at `path` as a read-only array backed by the file (ValueError when not as `spec` says, or short)."""
  a = np.load(path, mmap_mode="r", allow_pickle=False)
  if a.shape != (rows, *spec["shape"]) or a.dtype != np.dtype(spec["dtype"]):
    raise ValueError(f"{path}: {a.shape} {a.dtype}, expected {rows} rows of {spec}")
  return a.view(np.ndarray)  # Gathers from it give plain arrays; the mapping lives as long as the view.


def _write(stem: str, arrays: Rows, bad: dict[int, str]) -> None:
  """Writes the arrays and then the `.json` under temporary names, each renamed when complete; then drops the
  split's files of other digests (a dataset prepared again) and leftovers of killed writers."""
  tmp = f".tmp-{os.getpid()}"
  for i, a in enumerate(arrays.values()):
    with open(f"{stem}.{i}.npy{tmp}", "wb") as f:
      np.save(f, np.ascontiguousarray(a), allow_pickle=False)
    os.replace(f"{stem}.{i}.npy{tmp}", f"{stem}.{i}.npy")
  meta = {"rows": len(next(iter(arrays.values()))),
          "features": {k: {"shape": list(a.shape[1:]), "dtype": a.dtype.str} for k, a in arrays.items()},
          "bad": {str(i): why for i, why in bad.items()}}
  with open(f"{stem}.json{tmp}", "w") as f:
    json.dump(meta, f)
  os.replace(f"{stem}.json{tmp}", f"{stem}.json")
  ours = os.path.basename(stem) + "."
  here = os.path.dirname(stem)
  _remove(os.path.join(here, n) for n in os.listdir(here) if n != ".lock" and (not n.startswith(ours) or ".tmp-" in n))


def _remove(paths: Iterable[str]) -> None:
  """Removes what it can of `paths` (leftovers; nothing else reads them: the lock is held)."""
  for path in paths:
    with contextlib.suppress(OSError):
      os.remove(path)
