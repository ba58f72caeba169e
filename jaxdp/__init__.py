"""jaxdp: data-parallel (DDP) training for JAX.

Public names load on first use: `python -m jaxdp.train` must not find jaxdp.train already imported by
the package (runpy warns and runs it twice), and tools like `jaxdp.plot` start without JAX.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

from jaxdp.runtime import quiet  # noqa: F401  Before anything loads TensorFlow.

_PUBLIC = {
    "train_and_evaluate": "jaxdp.loop.train",
    "ConfigError": "jaxdp.config",
    "TrainState": "jaxdp.step",
    "get_model": "jaxdp.models",
}

# Modules that moved into packages, under the flat names users' scripts and notebooks import
# (`from jaxdp import cpu_devices`); `python -m jaxdp.<tool>` has a file of its own per tool.
_MOVED = {
    **{f"jaxdp.{m}": f"jaxdp.loop.{m}" for m in ("goodput", "preemption", "profiling", "replicas")},
    **{f"jaxdp.{m}": f"jaxdp.report.{m}" for m in ("flops", "metrics", "progress", "summary", "units")},
    **{f"jaxdp.{m}": f"jaxdp.runtime.{m}"
       for m in ("compilation_cache", "cpu_devices", "distributed", "exits", "quiet")},
    **{f"jaxdp.{m}": f"jaxdp.tools.{m}" for m in ("cli", "projection", "restore", "topology")},
}

__all__ = sorted(_PUBLIC)


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Imports a moved module under its old name as the very same module object."""

  def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
    return importlib.machinery.ModuleSpec(name, self) if name in _MOVED else None

  def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
    module = importlib.import_module(_MOVED[spec.name])
    spec.loader_state = module.__spec__  # The import system sets __spec__ to this alias's spec next.
    return module

  def exec_module(self, module: types.ModuleType) -> None:
    """Runs nothing (the module ran under its new name); gives it back its own spec."""
    module.__spec__ = module.__spec__.loader_state


sys.meta_path.append(_Moved())


class _ThenDatasets(quiet._Around):
  """jaxdp.data's loader, then jaxdp.datasets: the builders and kinds jaxdp ships register with jaxdp.data.

  The package wires the two so that jaxdp.data never imports jaxdp.datasets (which imports it), and
  `data.load("digits")` works wherever jaxdp.data is imported from (a notebook, a test, the loop).
  """

  def exec_module(self, module: types.ModuleType) -> None:
    self.loader.exec_module(module)
    importlib.import_module("jaxdp.datasets")


quiet._on_import("jaxdp.data", _ThenDatasets)


def __getattr__(name: str) -> Any:
  if name in _PUBLIC:
    return getattr(importlib.import_module(_PUBLIC[name]), name)
  raise AttributeError(f"module 'jaxdp' has no attribute {name!r}")
