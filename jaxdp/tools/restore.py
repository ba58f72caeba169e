"""What the tools that read a trained workdir share (`evaluate`, `sample`): its stored config, its restored state.

The config a checkpoint stores is their default (`cli.parse_workdir`), so a training run's overrides need
not be repeated; `--config.key=value` flags still change it, and `--config FILE` replaces it.
"""

import json
import os
from typing import Any

import ml_collections

from jaxdp.config import ConfigError


def stored_config(workdir: str, step: int | None = None) -> ml_collections.ConfigDict:
  """The config checkpoint `step` (default: the newest) of WORKDIR was trained with, on the default config."""
  from jaxdp import checkpoint  # JAX and orbax: after the command line has set the devices up.
  step = checkpoint.pick_step(workdir, step)
  entry = os.path.join(checkpoint.directory(workdir), str(step))
  try:
    with open(os.path.join(entry, "meta", "metadata")) as f:
      stored = json.load(f)["config"]
  except (OSError, ValueError, KeyError):
    raise ConfigError(f"checkpoint {entry} stores no config: pass --config CONFIG.py") from None
  from jaxdp.configs import default  # Its placeholders give unset (None) fields a type to override.
  config = default.get_config()
  _merge(config, _tuples(stored))
  return config


def restore(config: ml_collections.ConfigDict, workdir: str, step: int | None = None) -> tuple[Any, Any, int]:
  """(build.Parts, state, step): checkpoint `step` (default: newest) laid out for `config`'s devices and options."""
  from jaxdp import build, checkpoint  # JAX: only once the devices are set up.
  step = checkpoint.pick_step(workdir, step)
  parts = build.build(config)
  with checkpoint.Checkpointer(workdir, config) as ckpt:
    state = ckpt.restore_or_init(parts.backend, parts.init, step, strategy=parts.strategy)
  return parts, state, step


def _tuples(value: Any) -> Any:
  """JSON lists back to the tuples the config files use (and the override parser expects)."""
  if isinstance(value, dict):
    return {k: _tuples(v) for k, v in value.items()}
  if isinstance(value, list):
    return tuple(_tuples(v) for v in value)
  return value


def _merge(config: ml_collections.ConfigDict, values: dict[str, Any]) -> None:
  """Sets every stored value in `config`, adding keys it lacks (e.g. a model's keyword arguments)."""
  for key, value in values.items():
    if isinstance(value, dict) and isinstance(config.get(key), ml_collections.ConfigDict):
      _merge(config[key], value)
      continue
    with config.unlocked():
      try:
        config[key] = value
      except TypeError:  # Stored with another type than the default declares: the stored value wins.
        del config[key]
        config[key] = value
