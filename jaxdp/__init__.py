"""jaxdp: data-parallel (DDP) training for JAX.

Importing the package imports no JAX, so that `python -m jaxdp.train --cpu_devices N` can still set
XLA_FLAGS before JAX starts. Public names load on first use.
"""

import importlib
from typing import Any

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
