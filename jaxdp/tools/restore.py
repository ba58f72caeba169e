"""What the tools that read a trained workdir share (`evaluate`, `sample`): its config, its restored state.

The config defaults to the one the checkpoint stores, so a training run's overrides need not be repeated;
`--config.key=value` flags still change it, and `--config FILE` replaces it (as in training).
"""

import json
import os
from typing import Any

import ml_collections
from absl import flags
from ml_collections import config_flags

from jaxdp.tools import cli
from jaxdp.runtime import cpu_devices
from jaxdp.config import ConfigError

CHECKPOINT_DIR = "checkpoints"  # As jaxdp.checkpoint writes it; read here without importing JAX.


def parse(argv: list[str], *, usage: str, extra_help: str = "",
          step: int | None = None) -> tuple[ml_collections.ConfigDict, str]:
  """Command line -> (config, workdir): `--config FILE` as in training, else checkpoint `step`'s stored config."""
  if any(a in cli.HELP_FLAGS for a in argv[1:]) or any(a == "--config" or a.startswith("--config=") for a in argv):
    config, workdir = cli.parse(argv, require_workdir=True, usage=usage, extra_help=extra_help)
    return config, workdir
  fv = flags.FlagValues()
  flags.DEFINE_string("workdir", None, "", flag_values=fv)
  flags.DEFINE_integer("cpu_devices", None, "", flag_values=fv)
  workdir = _flag(argv, "--workdir")
  if not workdir:
    raise ConfigError("--workdir is required")
  stored = stored_config(workdir, step)
  config_flags.DEFINE_config_dict("config", stored, flag_values=fv, sys_argv=argv)
  try:
    fv(argv)
  except flags.Error as e:
    raise ConfigError(str(e)) from None
  except (AttributeError, KeyError, TypeError) as e:  # An override names a key the stored config lacks.
    raise ConfigError(f"bad config override ({e}) for the config stored in {workdir!r}") from None
  if (count := cpu_devices.requested(argv)) is not None:
    cpu_devices.simulate(count)
  return fv.config, workdir


def stored_config(workdir: str, step: int | None = None) -> ml_collections.ConfigDict:
  """The config checkpoint `step` (default: the newest) of WORKDIR was trained with, on the default config."""
  directory = os.path.join(workdir, CHECKPOINT_DIR)
  steps = sorted(int(n) for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(directory) else []
  if not steps:
    raise ConfigError(f"no checkpoint in workdir {workdir!r} (train with checkpoint_every_steps > 0)")
  step = steps[-1] if step is None else step
  if step not in steps:
    raise ConfigError(f"no checkpoint {step} in {directory} (have: {steps})")
  try:
    with open(os.path.join(directory, str(step), "meta", "metadata")) as f:
      stored = json.load(f)["config"]
  except (OSError, ValueError, KeyError):
    raise ConfigError(f"checkpoint {directory}/{step} stores no config: pass --config CONFIG.py") from None
  from jaxdp.configs import default  # Its placeholders give unset (None) fields a type to override.
  config = default.get_config()
  _merge(config, _tuples(stored))
  return config


def restore(config: ml_collections.ConfigDict, workdir: str, step: int | None = None) -> tuple[Any, Any, int]:
  """(build.Parts, state, step): checkpoint `step` (default: newest) laid out for `config`'s devices and options."""
  from jaxdp import build, checkpoint  # JAX: only once the devices are set up.
  parts = build.build(config)
  with checkpoint.Checkpointer(workdir, config) as ckpt:
    step = ckpt.latest_step() if step is None else step
    if step is None:
      raise ConfigError(f"no checkpoint in workdir {workdir!r} (train with checkpoint_every_steps > 0)")
    if step not in ckpt.manager.all_steps():
      raise ConfigError(f"no checkpoint {step} in {ckpt.directory} (have: {sorted(ckpt.manager.all_steps())})")
    state = ckpt.restore_or_init(parts.backend, parts.init, step)
  return parts, state, step


def _flag(argv: list[str], name: str) -> str | None:
  """The value of `name VALUE` or `name=VALUE` in argv."""
  for i, arg in enumerate(argv):
    if arg == name and i + 1 < len(argv):
      return argv[i + 1]
    if arg.startswith(name + "="):
      return arg.split("=", 1)[1]
  return None


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
