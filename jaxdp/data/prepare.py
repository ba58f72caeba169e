"""A TFDS builder by name, prepared once as ArrayRecord (one process prepares, the others wait), so that its
splits read by index; a dataset prepared as TFRecord only gets one line saying how to convert it."""

import contextlib
import fcntl
import glob
import os
import sys
import tempfile
from collections.abc import Callable, Iterator

import tensorflow_datasets as tfds

from jaxdp.config import ConfigError
from jaxdp.data import offline, tf_setup

RANDOM_ACCESS = tfds.core.file_adapters.FileFormat.ARRAY_RECORD


def open_prepared(make: Callable[..., tfds.core.DatasetBuilder]) -> tfds.core.DatasetBuilder:
  """`make()`'s builder, prepared once (as ArrayRecord) if it is not yet.

  Every process that found the dataset unprepared reopens it afterwards: a builder made before the
  dataset was prepared (by this process or another) keeps empty splits.
  """
  with _no_temp_dirs_left():
    builder = make()
  if builder.is_prepared() or offline.mocked(builder):
    if offline.mocked(builder):
      builder.download_and_prepare()  # A no-op under tfds.testing.mock_data.
    return builder
  offline.check_can_prepare(builder)  # Fails in seconds, not after minutes of download retries.
  _prepare(make, builder)
  return make()


@contextlib.contextmanager
def _no_temp_dirs_left() -> Iterator[None]:
  """Removes, on the way out, the empty temp dirs TFDS's builders made inside."""
  # Every builder of a dataset not yet prepared makes one ("tmp*tfds", in `DatasetInfo.initialize_from_bucket`,
  # before it asks GCS for the dataset's info) and keeps it, also when the answer is nothing (GCS off, the default).
  pattern = os.path.join(tempfile.gettempdir(), "tmp*tfds")
  before = set(glob.glob(pattern))
  try:
    yield
  finally:
    for path in set(glob.glob(pattern)) - before:
      with contextlib.suppress(OSError):  # Not empty (GCS answered), or already gone.
        os.rmdir(path)


def _prepare(make: Callable[..., tfds.core.DatasetBuilder], builder: tfds.core.DatasetBuilder) -> None:
  """Prepares the dataset as ArrayRecord under a file lock: one process prepares, the others wait."""
  root = os.fspath(builder.data_dir_root)
  os.makedirs(root, exist_ok=True)
  lock_path = os.path.join(root, f".{builder.name}.prepare.lock")
  with open(lock_path, "w") as lock, contextlib.ExitStack() as stack:
    fcntl.flock(lock, fcntl.LOCK_EX)
    stack.callback(fcntl.flock, lock, fcntl.LOCK_UN)
    with _no_temp_dirs_left():
      fresh = make(file_format=RANDOM_ACCESS.value)  # Another process may have prepared it meanwhile.
    if not fresh.is_prepared():
      tf_setup.tensorflow()  # TFDS encodes the examples with TensorFlow.
      # jaxdp's one line in place of TFDS's prints (quiet.tfds_prints drops them), from whichever process holds the
      # lock: a run that has to prepare says so, once, even when process 0 only waits.
      print(f"preparing dataset {fresh.info.full_name} in {root} (once; other processes wait)", file=sys.stderr,
            flush=True)
      fresh.download_and_prepare()


def random_access(builder: tfds.core.DatasetBuilder) -> bool:
  """Whether the builder's splits read by index (prepared as ArrayRecord, or mocked)."""
  return offline.mocked(builder) or RANDOM_ACCESS in builder.info.available_file_formats()


def require_random_access(builder: tfds.core.DatasetBuilder) -> None:
  """A dataset prepared as TFRecord only: one line saying how to convert it."""
  if random_access(builder):
    return
  formats = ", ".join(sorted(f.value for f in builder.info.available_file_formats())) or "unknown"
  raise ConfigError(
      f"dataset {builder.name!r} is prepared in {str(builder.data_dir)!r} as {formats} only; jaxdp reads "
      f"examples by index from ArrayRecord. Convert it once with `python -m jaxdp.data.convert "
      f"{builder.data_dir}`")
