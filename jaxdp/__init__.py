"""jaxdp: data-parallel (DDP) training for JAX. Importing it loads neither JAX nor TensorFlow (public names load at
first use), so `python -m jaxdp.train` does not find itself imported and `jaxdp.plot` starts without JAX."""

import gc
import importlib
from typing import Any

# How many objects were frozen when jaxdp started: CPython 3.12.1 starts with some (and a full collection freezes
# them again). Only more than this is a caller's own freeze, which the loop's collector leaves alone
# (jaxdp.loop.collector). Read here, so that importing jaxdp changes nothing.
_FROZEN_AT_START = gc.get_freeze_count()

_PUBLIC = {
    "train_and_evaluate": "jaxdp.loop.train",
    "ConfigError": "jaxdp.config",
    "TrainState": "jaxdp.step",
    "get_model": "jaxdp.models",
    "DataParallel": "jaxdp.library",
    "Hook": "jaxdp.loop.hooks",
    "StepInfo": "jaxdp.loop.hooks",
    "hook": "jaxdp.loop.hooks",
    "STOP": "jaxdp.loop.hooks",
    "HookError": "jaxdp.loop.hooks",
    "EarlyStopping": "jaxdp.loop.hooks",
    "WandbTracker": "jaxdp.report.wandb_tracker",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
  if name in _PUBLIC:
    return getattr(importlib.import_module(_PUBLIC[name]), name)
  raise AttributeError(f"module 'jaxdp' has no attribute {name!r}")
