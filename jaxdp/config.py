"""Config validation with clear errors, and the values derived from a config."""

import dataclasses
import difflib
import importlib
from collections.abc import Callable
from typing import Any

import ml_collections

from jaxdp.configs import default

DTYPES = ("float32", "bfloat16", "float16")
_ABSENT = object()


class ConfigError(ValueError):
  """A config or command-line mistake; the CLI reports it in one line and exits with status 2."""


@dataclasses.dataclass(frozen=True)
class Layout:
  """How the global batch is split over processes and devices."""
  num_devices: int
  num_processes: int
  global_batch: int
  eval_global_batch: int

  @property
  def per_device_batch(self) -> int:
    return self.global_batch // self.num_devices

  @property
  def process_batch(self) -> int:
    return self.global_batch // self.num_processes


# Sub-configs that are someone else's keyword arguments (the model's, the builder's): a default there
# would be an argument the user never gave.
_OWN_FIELDS = ("model", "builder_kwargs", "optimizer_kwargs")
# Sections whose keys are anyone's (a model's, a task's, an optimizer's, a TFDS builder's keyword arguments): every
# other key a config sets must be one of configs/default.py's, or it would be ignored.
OPEN_SECTIONS = ("model", "task", "optimizer_kwargs", "dataset.builder_kwargs")
# Keys that take numbers or names, where a user may set an object that belongs in a Python argument, and that argument.
# Such a field takes any type (configs/default.py), so that the assignment reaches this check: ml_collections' own
# type check would raise a TypeError that names neither.
AS_ARGUMENTS = {
    "learning_rate": "learning_rate is a number (lr_schedule shapes it); pass a schedule object in an optimizer: "
                     "train_and_evaluate(..., optimizer=optax.adamw(schedule)), dp.init(model, optax.adamw(schedule))",
}
# Keys jaxdp no longer has, and what took their place. A config that sets one is a ConfigError naming it; the
# config a checkpoint stores drops them (`drop_removed`), so that older runs still evaluate and resume.
REMOVED = {
    "xla_cpu_flags": "XLA:CPU runs with XLA's defaults; set XLA_FLAGS before JAX starts to change them",
    "gc_every_steps": "a constant now: docs/design-notes.md#garbage-collection",
    "preemption_sync_every_steps": "without JAX's preemption service the processes agree on every step",
    "parallel.max_steps_in_flight": "a constant now: docs/design-notes.md#steps-in-flight",
    "dataset.max_memory_gb": "it limited nothing",
    "parallel.flat_allreduce": "the gradient is all-reduced leaf by leaf everywhere",
    "parallel.bucket_bytes": "the gradient is all-reduced leaf by leaf everywhere",
    "dataset.shuffle_buffer": "a TFRecord-only dataset is converted (python -m jaxdp.data.convert), never streamed",
    "parallel.block_mb": "batches with nothing to decode travel in blocks of a fixed size: jaxdp.feed",
    "parallel.resident_mb": "a train split is no longer held on the devices: docs/design-notes.md#one-feeder",
    "label_smoothing": "a task argument now: config.task.label_smoothing",
    "momentum": 'set optimizer="sgd" with optimizer_kwargs={"momentum": 0.9}',
    "nesterov": 'set optimizer="sgd" with optimizer_kwargs={"momentum": 0.9, "nesterov": True}',
    "base_batch_size": "no linear scaling rule: set learning_rate to the peak for your batch_size yourself",
    "compilation_cache_dir": "jaxdp caches in ~/.cache/jaxdp/xla unless JAX_COMPILATION_CACHE_DIR is set; "
                             "JAX_ENABLE_COMPILATION_CACHE=false turns the cache off",
    "distributed.coordinator_address": "set JAXDP_COORDINATOR_ADDRESS (or JAX_COORDINATOR_ADDRESS); "
                                       "python -m jaxdp.launch sets it",
    "distributed.num_processes": "set JAXDP_NUM_PROCESSES (or JAX_NUM_PROCESSES); python -m jaxdp.launch sets it",
    "distributed.process_id": "set JAXDP_PROCESS_ID (or JAX_PROCESS_ID); python -m jaxdp.launch sets it",
    "distributed.auto_detect": "JAX's cluster detection is always on; it joins a run only where it finds several "
                               "processes",
    "distributed.init_timeout_s": "a constant now (300 s: runtime/distributed.py's INIT_TIMEOUT_S)",
    "distributed.heartbeat_timeout_s": "a constant now (100 s: runtime/distributed.py's HEARTBEAT_TIMEOUT_S)",
    "dataset.prefetch": "parallel.prefetch is the one prefetch setting; tf.data's own depth is a constant",
    "dataset.cache_on_disk": "a split held decoded is always kept in files beside the dataset where it can be written",
    "dataset.crop_ratio": "a constant: Inception's central crop, 0.875 of the shorter side",
    "dataset.shard_by_process": "the one global order reads by index on any process count",
    "async_checkpointing": "the trainer always saves in the background; DataParallel.save returns with it written",
    "max_consecutive_nonfinite": "a constant now (5 skipped steps in a row stop the run: "
                                 "loop/step_metrics.py's MAX_CONSECUTIVE_NONFINITE)",
    "check_replicas_every_steps": "the replicas are compared at every checkpoint save and at the last step",
}


def with_defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of `config` with every key it lacks from `configs/default.py` (the one home of defaults; idempotent)."""
  as_dict = config.to_dict(preserve_field_references=False)
  for key in REMOVED:
    if _drop(dict(as_dict), key.split(".")):  # On a copy: `_drop` copies each section it enters.
      raise removed(key)
  defaults = default.get_config()
  _check_known(as_dict, defaults.to_dict(), "")
  full = ml_collections.ConfigDict(as_dict)
  _fill(full, defaults)
  return full


def removed(key: str) -> ConfigError:
  """The one error of a config that sets `key`, a key of REMOVED."""
  return ConfigError(f"config key {key!r} was removed ({REMOVED[key]}): delete it from the config")


def unknown(key: str, known: list[str] | None = None) -> ConfigError:
  """The one error of a config (Python's or the command line's) that sets `key` ("parallel.shard_paramz"), which
  jaxdp does not know and would ignore: it names the nearest of `known` (default: its neighbours in the defaults)."""
  if known is None:
    *section, _ = key.split(".")
    node = default.get_config().to_dict()
    for part in section:
      node = node.get(part) if isinstance(node.get(part), dict) else {}
    known = [".".join([*section, k]) for k in node]
  hint = difflib.get_close_matches(key, known, n=1)
  return ConfigError(f"unknown config key 'config.{key}'" + (f" (did you mean {hint[0]!r}?)" if hint else ""))


def _check_known(node: dict[str, Any], defaults: dict[str, Any], prefix: str) -> None:
  """A ConfigError for the first key of `node` that `defaults` lacks (outside OPEN_SECTIONS) or of AS_ARGUMENTS."""
  for key, value in node.items():
    path = prefix + key
    if path in OPEN_SECTIONS:
      continue
    if key not in defaults:
      raise unknown(path, [prefix + k for k in defaults])
    if path in AS_ARGUMENTS and callable(value):
      raise ConfigError(AS_ARGUMENTS[path])
    if isinstance(value, dict) and isinstance(defaults[key], dict):
      _check_known(value, defaults[key], path + ".")


def drop_removed(stored: dict[str, Any]) -> dict[str, Any]:
  """A config as a checkpoint stores it (JSON), without the keys jaxdp has since removed."""
  out = dict(stored)
  for key in REMOVED:
    _drop(out, key.split("."))
  return out


def _drop(node: dict[str, Any], path: list[str]) -> bool:
  """Deletes the dotted `path` from `node`, copying each section it enters (one left empty goes too); whether set."""
  first, *rest = path
  if not rest:
    return node.pop(first, _ABSENT) is not _ABSENT
  if not isinstance(node.get(first), dict):
    return False
  node[first] = section = dict(node[first])
  found = _drop(section, rest)
  if not section:  # A section left empty was removed whole.
    del node[first]
  return found


def _fill(config: ml_collections.ConfigDict, defaults: ml_collections.ConfigDict) -> None:
  """Adds to `config`, in place and recursively, every field of `defaults` that it lacks."""
  for key, value in defaults.items(preserve_field_references=True):
    if key not in config:
      config[key] = value
    elif (key not in _OWN_FIELDS and isinstance(value, ml_collections.ConfigDict)
          and isinstance(config[key], ml_collections.ConfigDict)):
      _fill(config[key], value)


def import_named(name: str, what: str) -> Any:
  """The object "package.module:attr" names (a model, task or dataset of one's own); a ConfigError naming it."""
  module_name, _, attr = name.partition(":")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ConfigError(f"unknown {what} {name!r}: cannot import module {module_name!r}: {e}") from None
  try:
    return getattr(module, attr)
  except AttributeError:
    raise ConfigError(f"unknown {what} {name!r}: module {module_name!r} has no {attr!r}") from None


def validate(config: ml_collections.ConfigDict, num_devices: int, num_processes: int) -> Layout:
  """Checks the fields every run needs in a defaults-filled `config` (a strategy checks its own); the batch layout."""
  for key in ("batch_size", "num_train_steps", "log_every_steps", "eval_every_steps", "parallel.prefetch"):
    _number(config, key, lambda v: v >= 1, "a positive integer", integer=True)
  _number(config, "learning_rate", lambda v: v > 0, "a positive number")
  # eval_batch_size 0: the train batch size.
  layout = Layout(num_devices, num_processes, config.batch_size, config.eval_batch_size or config.batch_size)
  for key, size in (("batch_size", layout.global_batch), ("eval_batch_size", layout.eval_global_batch)):
    if size % num_devices:
      raise ConfigError(f"{key} ({size}) must be divisible by the number of devices ({num_devices})")
  accum = config.grad_accum_steps
  if not isinstance(accum, int) or accum < 1 or layout.per_device_batch % accum:
    raise ConfigError(f"grad_accum_steps ({accum!r}) must be a positive divisor of the per-device batch "
                      f"({layout.per_device_batch})")
  _number(config, "max_grad_norm", lambda v: v >= 0, "a number >= 0 (0: no clipping)")
  for key, value in (("dtype", config.dtype), ("parallel.allreduce_dtype", config.parallel.allreduce_dtype)):
    if value not in DTYPES:
      raise ConfigError(f"unknown {key} {value!r} (choose from {', '.join(DTYPES)})")
  return layout


def mib(value: Any) -> float:
  """A setting in MiB as a float: a number, or its text (as a stored config's override gives it); NaN otherwise."""
  if isinstance(value, bool) or not isinstance(value, (int, float, str)):
    return float("nan")
  try:
    return float(value)
  except ValueError:
    return float("nan")


def _number(config: ml_collections.ConfigDict, key: str, ok: Callable[[float], bool], what: str, *,
            integer: bool = False) -> None:
  """A ConfigError unless `key` ("parallel.prefetch") is a number (an int if `integer`; no bool) where `ok` holds."""
  value = config[key]  # ConfigDict reads a dotted key ("parallel.prefetch") as nested fields.
  if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or not ok(value):
    raise ConfigError(f"{key} must be {what}, got {value!r}")
