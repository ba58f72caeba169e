"""TensorFlow's start-up lines and its eager Keras import off: imported first by jaxdp, before TensorFlow loads.

TensorFlow (used for input only) prints lines at import on every command, before its log level is read:
TF_ENABLE_ONEDNN_OPTS=0 drops the oneDNN notice (oneDNN speeds up TensorFlow's own matmuls and
convolutions, which jaxdp does not run), TF_CPP_MIN_LOG_LEVEL=1 drops the other INFO lines; warnings and
errors still print. A value the user set wins.

TensorFlow's `__init__` also imports Keras eagerly (to register Keras optimizers for SavedModels), which
pulls in scikit-learn and takes about a third of TensorFlow's import: 1.2 s of the default run's 7 s
start, in every process. tf.data needs none of it, and TensorFlow skips that import when Keras is
missing, so while TensorFlow's own `__init__` runs, `keras` reads as missing. Afterwards `import keras`
and `tf.keras` load Keras as usual.
"""

import importlib.abc
import importlib.util
import os
import sys

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


class _TensorFlowWithoutKeras(importlib.abc.MetaPathFinder):
  """Finds `tensorflow` (once) with a loader that hides Keras while TensorFlow's `__init__` runs."""

  def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201  (the import system's signature)
    if name != "tensorflow":
      return None
    sys.meta_path.remove(self)  # One import of TensorFlow per process; this also keeps the lookup below plain.
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.loader is not None and "keras" not in sys.modules:
      spec.loader = _HideKeras(spec.loader)
    return spec


class _HideKeras(importlib.abc.Loader):
  """Runs a module's loader with `keras` absent from the import system, as if it were not installed."""

  def __init__(self, loader: importlib.abc.Loader):
    self.loader = loader

  def create_module(self, spec):  # noqa: ANN001, ANN201
    return self.loader.create_module(spec)

  def exec_module(self, module) -> None:  # noqa: ANN001
    sys.modules["keras"] = None  # An import of keras now raises ImportError; find_spec raises ValueError.
    try:
      self.loader.exec_module(module)
    finally:
      if "keras" in sys.modules and sys.modules["keras"] is None:
        del sys.modules["keras"]


if "tensorflow" not in sys.modules and not any(isinstance(f, _TensorFlowWithoutKeras) for f in sys.meta_path):
  sys.meta_path.insert(0, _TensorFlowWithoutKeras())
