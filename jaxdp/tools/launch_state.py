"""The launcher's state dir (the files its processes create once they joined the run), and its clean-up."""

import contextlib
import fcntl
import glob
import os
import shutil
import tempfile
from collections.abc import Iterator

PREFIX = "jaxdp-launch-"
# Locked by the launcher that made the dir while it lives: the kernel drops the lock however it dies, so a later
# launcher removes the dirs of killed ones.
OWNER = "owner"


@contextlib.contextmanager
def state_dir() -> Iterator[str]:
  """A new state dir, owned while the context lasts; the dead launchers' dirs are removed first."""
  sweep(tempfile.gettempdir())
  with tempfile.TemporaryDirectory(prefix=PREFIX) as path:
    with open(os.path.join(path, f".{OWNER}"), "w") as owner:
      fcntl.flock(owner, fcntl.LOCK_EX)
      os.rename(owner.name, os.path.join(path, OWNER))  # Named only once locked: a sweep never finds it free.
      yield path


def sweep(root: str) -> list[str]:
  """Removes the state dirs under `root` whose launcher died; returns them."""
  removed = []
  for path in glob.glob(os.path.join(glob.escape(root), PREFIX + "*")):
    try:
      owner = open(os.path.join(path, OWNER))
    except OSError:  # Not one of ours, being made, just removed, or made before dirs had owners.
      continue
    with owner:
      try:
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError:  # Its launcher lives.
        continue
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)
  return removed
