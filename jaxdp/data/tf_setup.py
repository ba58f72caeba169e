"""TensorFlow's one-time setup, run when it is first imported, by whoever imports it (the pipeline at its first
use, TFDS, a user): it only feeds the input pipeline, so it must never take accelerator memory.

The pipeline imports TensorFlow where it uses it, not at import (it takes seconds; a process that never decodes
nor shuffles does not pay it), so the setup hooks TensorFlow's import. The hook keeps its spec until TensorFlow
really loads: etils' paths (TFDS's) call `importlib.util.find_spec("tensorflow")` on every path, a look-up that
loads nothing; a one-shot hook (`quiet._OnImport`) would be spent by it, and so would quiet's own (Keras hidden),
which this hook finds first and keeps inside its spec.
"""

import copy
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types

from jaxdp.runtime import quiet


def no_accelerators(tf: types.ModuleType) -> None:
  """TensorFlow sees no GPU (before any TF op: the devices are set once, at its first use)."""
  tf.config.set_visible_devices([], "GPU")


class _ThenNoAccelerators(quiet._Around):
  """TensorFlow's loader, then `no_accelerators`; its finder leaves the import system."""

  def __init__(self, loader: importlib.abc.Loader, finder: "_Finder"):
    super().__init__(loader)
    self.finder = finder

  def exec_module(self, module: types.ModuleType) -> None:
    self.loader.exec_module(module)
    if self.finder in sys.meta_path:
      sys.meta_path.remove(self.finder)
    no_accelerators(module)


class _Finder(importlib.abc.MetaPathFinder):
  """Finds `tensorflow` with its loader wrapped (`_ThenNoAccelerators`), the same wrapped loader for every look-up
  until it is imported."""

  def __init__(self):
    self._spec: importlib.machinery.ModuleSpec | None = None
    self._lock = threading.RLock()
    self._finding = False  # Inside this finder's own look-up (the finders after it): it answers nothing.

  def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201  (the import system's signature)
    if name != "tensorflow":
      return None
    with self._lock:
      if self._finding:
        return None
      if self._spec is None:
        self._finding = True
        try:
          spec = importlib.util.find_spec(name)  # The finders after this one (quiet's wraps the loader too).
        finally:
          self._finding = False
        if spec is None or spec.loader is None:
          return spec
        spec.loader = _ThenNoAccelerators(spec.loader, self)
        self._spec = spec
      return copy.copy(self._spec)  # A spec of its own for each look-up: an import writes to it.


def install() -> None:
  """Sets TensorFlow up now if it is loaded (a notebook imported it before jaxdp), else at its import."""
  if "tensorflow" in sys.modules:
    no_accelerators(sys.modules["tensorflow"])
  elif not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
