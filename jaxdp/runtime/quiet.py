"""Other libraries' noise off: TFDS's prints around preparing (`tfds_prints`), and for a command (`command`: it owns
its process) TensorFlow's start-up lines, libtpu's start-up warnings, TFDS's bars and its warnings."""

import contextlib
import glob
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Iterator

_GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips are PCI devices of Google's vendor id.
# Read by TensorFlow before its log level: TF_ENABLE_ONEDNN_OPTS=0 drops the oneDNN notice at its import (oneDNN
# speeds up TensorFlow's own matmuls, which jaxdp does not run), TF_CPP_MIN_LOG_LEVEL=2 the other INFO lines and
# the warnings (a failing tf.data worker logs its whole traceback, which jaxdp reports in one line).
TF_ENV = {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}


def command() -> None:
  """Quiets the libraries a command loads: called by the CLI before JAX or TFDS loads, never at import."""
  # TF_ENV is also set by `data.reader` where it imports TensorFlow.
  for name, value in TF_ENV.items():  # Before JAX, whose import sets TF_CPP_MIN_LOG_LEVEL=1. A user's value wins.
    os.environ.setdefault(name, value)
  if importlib.util.find_spec("libtpu") is not None and not _tpu_chips_attached():
    # JAX tries libtpu on every run; a one-host topology, read only by that failed start, silences its warnings.
    os.environ.setdefault("TPU_HOST_BOUNDS", "1,1,1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  from absl import logging as absl_logging
  absl_logging.get_absl_logger().addFilter(_not_tfds_chatter)
  import tensorflow_datasets as tfds  # Without TensorFlow: TFDS loads it at its first use.
  tfds.disable_progress_bar()


def _tpu_chips_attached() -> bool:
  """Whether a PCI device of Google's vendor id (a TPU chip) is attached."""
  # A Google virtual NIC counts too (its warnings then show): the variables must never reach a multi-host slice.
  for path in glob.glob("/sys/bus/pci/devices/*/vendor"):
    with contextlib.suppress(OSError), open(path) as f:
      if f.read().strip() == _GOOGLE_PCI_VENDOR:
        return True
  return False


def _not_tfds_chatter(record: logging.LogRecord) -> bool:
  """False for TFDS's own absl lines below ERROR (its per-run warnings on a user's dataset)."""
  return record.levelno >= logging.ERROR or f"{os.sep}tensorflow_datasets{os.sep}" not in record.pathname


_TFDS_PRINTS = re.compile(r"^(\x1b\[[\d;]*m)*(Downloading and preparing dataset |Dataset \S+ downloaded and prepared to )")


class _DropTfdsPrints:
  """A text stream passing every line on to `stream` but TFDS's "preparing" and "prepared" prints."""

  def __init__(self, stream):  # noqa: ANN001  (any text stream)
    self.stream, self.pending = stream, ""

  def write(self, text: str) -> int:
    *lines, self.pending = (self.pending + text).split("\n")
    for line in lines:
      if not _TFDS_PRINTS.match(line):
        self.stream.write(line + "\n")
    return len(text)

  def flush(self) -> None:
    self.stream.flush()


@contextlib.contextmanager
def tfds_prints() -> Iterator[None]:
  """Inside: TFDS's two print()s around preparing a dataset are dropped; every other line of stdout stays."""
  quiet = _DropTfdsPrints(sys.stdout)
  with contextlib.redirect_stdout(quiet):
    yield
  if quiet.pending and not _TFDS_PRINTS.match(quiet.pending):
    quiet.stream.write(quiet.pending)
