"""What the tools on a trained workdir share (`evaluate`, `sample`): its stored config, its restored state."""

import json
import os
from typing import Any

import ml_collections

from jaxdp import config as config_lib
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
  return config_from(stored)


def config_from(stored: dict[str, Any]) -> ml_collections.ConfigDict:
  """A config as a checkpoint stores it (JSON) -> a ConfigDict: the default config with every stored value set."""
  from jaxdp.configs import default  # Its placeholders give unset (None) fields a type to override.
  config = default.get_config()
  _merge(config, _tuples(config_lib.drop_removed(stored)))  # Older runs stored keys jaxdp has since removed.
  return config


def restore(config: ml_collections.ConfigDict, workdir: str, step: int | None, call: str,
            **passed: Any) -> tuple[Any, Any, int]:
  """(build.Parts, state, step): checkpoint `step`'s params and model state on `config`'s devices; `passed`: objects."""
  from jaxdp import build, checkpoint, optim  # JAX: only once the devices are set up.
  from jaxdp import objects as objects_lib
  objects = objects_lib.Objects(**passed)
  check_objects(config, workdir, objects, call)
  step = checkpoint.pick_step(workdir, step)
  # No optimizer: the parameters alone are restored, so a run trained with any optimizer (an object) evaluates.
  parts = build.build(config, **objects.build_kwargs(), optimizer=optim.NONE)
  with checkpoint.Checkpointer(workdir, config) as ckpt:
    state = ckpt.restore_or_init(parts.backend, parts.init, step, strategy=parts.strategy, params_only=True)
  return parts, state, step


def check_objects(config: ml_collections.ConfigDict, workdir: str, objects: Any, call: str) -> None:
  """A ConfigError, in one line, when `config` names an object passed from Python that `objects` lacks."""
  from jaxdp import objects as objects_lib
  given = set(objects.build_kwargs())
  missing = {k: name for k, name in objects_lib.passed_objects(config).items()
             if k not in given and not (k == "eval_data" and "train_data" in given)}
  if not missing:
    return
  what = ", ".join(f"{k} {name}" for k, name in missing.items())
  args = ", ".join(f"{k}={_short(name)}" for k, name in missing.items())
  raise ConfigError(f"the run in {workdir!r} was trained with {what} passed from Python, which no command line "
                    f"can name: call {call}(config, workdir, {args}) from Python with the same object"
                    f"{'s' * (len(missing) > 1)}")


def _short(name: str) -> str:
  """'<object __main__.Net>' -> 'Net'; '__main__:Net' -> 'Net'; '<object __main__.Net instance>' -> 'Net(...)'."""
  instance = name.endswith(" instance>")
  short = name.removeprefix("<object ").removesuffix(">").removesuffix(" instance").replace(":", ".").rpartition(".")[2]
  return f"{short}(...)" if instance else short


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
