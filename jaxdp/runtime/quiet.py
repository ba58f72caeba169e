"""TensorFlow's start-up lines and its eager Keras import off: imported first by jaxdp, before TensorFlow loads.

TensorFlow (used for input only) prints lines at import on every command, before its log level is read:
TF_ENABLE_ONEDNN_OPTS=0 drops the oneDNN notice (oneDNN speeds up TensorFlow's own matmuls and
convolutions, which jaxdp does not run), TF_CPP_MIN_LOG_LEVEL=2 drops the other INFO lines and its
warnings: a failing tf.data worker logs its whole Python traceback as a warning, once per failed call,
before the error reaches jaxdp, which reports it in one line. Errors still print. A value the user set wins.

libtpu (the `tpu` extra, installed for ahead-of-time TPU compiles) is tried by JAX on every run and, on a
machine without TPU chips, prints host-bounds and worker-hostname warnings: there, a one-host topology
(TPU_HOST_BOUNDS, TPU_WORKER_HOSTNAMES) is set, which only that failed TPU start reads.

TFDS warns on every run of a user's dataset ("Variant folder ... has no dataset_info.json", "Using custom
data configuration") and draws progress bars while preparing: once TFDS loads, its absl warnings below
ERROR are dropped and its bars are off (`tfds_prints` drops its two "prepared" prints).

TensorFlow's `__init__` also imports Keras eagerly (to register Keras optimizers for SavedModels), which
pulls in scikit-learn and takes about a third of TensorFlow's import, in every process
(docs/design-notes.md#tensorflows-keras-import). tf.data needs none of it, and TensorFlow skips that import when Keras is
missing, so while TensorFlow's own `__init__` runs, `keras` reads as missing. Afterwards `import keras`
and `tf.keras` load Keras as usual.
"""

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Iterator

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class _OnImport(importlib.abc.MetaPathFinder):
  """Finds module `name` (once) with its loader wrapped by `wrap`, which runs around its `exec_module`."""

  def __init__(self, name: str, wrap: type["_Around"]):
    self.name, self.wrap = name, wrap

  def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201  (the import system's signature)
    if name != self.name:
      return None
    sys.meta_path.remove(self)  # One import of the module per process; this also keeps the lookup below plain.
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.loader is not None:
      spec.loader = self.wrap(spec.loader)
    return spec


class _Around(importlib.abc.Loader):
  """A module's own loader, with something done around its `exec_module` (the subclass's)."""

  def __init__(self, loader: importlib.abc.Loader):
    self.loader = loader

  def create_module(self, spec):  # noqa: ANN001, ANN201
    return self.loader.create_module(spec)


class _HideKeras(_Around):
  """Runs TensorFlow's loader with `keras` absent from the import system, as if it were not installed."""

  def exec_module(self, module) -> None:  # noqa: ANN001
    if "keras" in sys.modules:  # Already loaded: hiding it now would change nothing.
      self.loader.exec_module(module)
      return
    sys.modules["keras"] = None  # An import of keras now raises ImportError; find_spec raises ValueError.
    try:
      self.loader.exec_module(module)
    finally:
      if "keras" in sys.modules and sys.modules["keras"] is None:
        del sys.modules["keras"]


class _ThenQuiet(_Around):
  """Runs TFDS's loader, then quiets it (`_quiet_tfds`)."""

  def exec_module(self, module) -> None:  # noqa: ANN001
    # TFDS finds its own files through its module's loader (importlib.resources): give it the real one.
    module.__loader__ = module.__spec__.loader = self.loader
    self.loader.exec_module(module)
    _quiet_tfds(module)


def _quiet_tfds(tfds) -> None:  # noqa: ANN001  (the tensorflow_datasets module)
  """Turns TFDS's progress bars and its absl warnings (below ERROR) off."""
  tfds.disable_progress_bar()
  from absl import logging as absl_logging
  absl_logging.get_absl_logger().addFilter(_not_tfds_chatter)


def _on_import(name: str, wrap: type[_Around]) -> None:
  """Wraps module `name`'s loader by `wrap` when it is first imported (once per process)."""
  if name not in sys.modules and not any(isinstance(f, _OnImport) and f.name == name for f in sys.meta_path):
    sys.meta_path.insert(0, _OnImport(name, wrap))


def _not_tfds_chatter(record: logging.LogRecord) -> bool:
  """False for TFDS's own absl lines below ERROR (a logging filter)."""
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


def _tpu_chips_attached() -> bool:
  """Whether this machine has TPU chips, by JAX's own PCI check (its module run alone: JAX is not imported)."""
  try:
    jax_dir = importlib.util.find_spec("jax").submodule_search_locations[0]
    spec = importlib.util.spec_from_file_location("_jaxdp_hardware_utils", os.path.join(jax_dir, "_src",
                                                                                         "hardware_utils.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.num_available_tpu_chips_and_device_id()[0] > 0
  except (AttributeError, ImportError, OSError, TypeError):  # No JAX, or its layout changed: leave libtpu alone.
    return True


if importlib.util.find_spec("libtpu") is not None and not _tpu_chips_attached():
  os.environ.setdefault("TPU_HOST_BOUNDS", "1,1,1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")

if "tensorflow_datasets" in sys.modules:  # Loaded before jaxdp (e.g. in a notebook): quieted now.
  _quiet_tfds(sys.modules["tensorflow_datasets"])
_on_import("tensorflow_datasets", _ThenQuiet)
_on_import("tensorflow", _HideKeras)
