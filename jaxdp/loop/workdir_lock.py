"""One run per workdir: process 0 holds a flock on WORKDIR/jaxdp.lock while it runs (the kernel drops it at death)."""

import contextlib
import fcntl
import logging
import os
import socket
from collections.abc import Iterator

import jax

from jaxdp.config import ConfigError
from jaxdp.loop import hooks

FILE = "jaxdp.lock"
log = logging.getLogger("jaxdp")


def _take(path: str) -> tuple[int | None, str]:
  """(the open file holding the lock, "") or (None, who holds it); (None, "") where the filesystem has no locks."""
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = os.pread(fd, 256, 0).decode(errors="replace").strip()
    os.close(fd)
    return None, holder or "a run that has not yet written its name"
  except OSError as e:  # ENOLCK, ENOSYS: some network mounts have no locks (Lustre without -o flock).
    os.close(fd)
    log.warning("workdir lock %s not taken (%s): a second run there would not be refused", path, e.strerror or e)
    return None, ""
  os.ftruncate(fd, 0)
  os.pwrite(fd, f"process 0 on host {socket.gethostname()}, pid {os.getpid()}\n".encode(), 0)
  return fd, ""


@contextlib.contextmanager
def hold(workdir: str) -> Iterator[None]:
  """Holds `workdir` for this run; a ConfigError naming the holder where a live run already holds it."""
  fd, holder = _take(os.path.join(workdir, FILE)) if jax.process_index() == 0 else (None, "")
  if hooks.any_process(bool(holder)):  # Only process 0 can be refused: none writes into a workdir it was refused.
    raise ConfigError(f"workdir {workdir!r} is in use by a live run ({holder or 'seen by process 0'}): stop it "
                      f"or choose another --workdir; processes of one run join it (jax.distributed) first")
  try:
    yield
  finally:
    if fd is not None:
      os.close(fd)  # Releases the lock.
