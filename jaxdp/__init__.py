"""jaxdp: data-parallel (DDP) training for JAX.

Importing the package imports no JAX, so the command-line tools start fast. Public names load on
first use.
"""

import importlib
import os
from typing import Any

# TensorFlow (used for input only) prints start-up lines at import on every command, before its log
# level is read: TF_ENABLE_ONEDNN_OPTS=0 drops the oneDNN notice (oneDNN speeds up TF's own matmuls and
# convolutions, which jaxdp does not run), TF_CPP_MIN_LOG_LEVEL=1 drops the other INFO lines; warnings and
# errors still print. A value the user set wins.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

_PUBLIC = {
    "train_and_evaluate": "jaxdp.train",
    "ConfigError": "jaxdp.config",
    "TrainState": "jaxdp.step",
    "get_model": "jaxdp.models",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
  if name in _PUBLIC:
    return getattr(importlib.import_module(_PUBLIC[name]), name)
  raise AttributeError(f"module 'jaxdp' has no attribute {name!r}")
