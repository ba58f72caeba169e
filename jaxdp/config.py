"""Config validation with clear errors, and the values derived from a config."""

import dataclasses

import ml_collections

from jaxdp.configs import default

DTYPES = ("float32", "bfloat16", "float16")


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

  @property
  def eval_process_batch(self) -> int:
    return self.eval_global_batch // self.num_processes


# Sub-configs that are someone else's keyword arguments (the model's, the builder's): a default there
# would be an argument the user never gave.
_OWN_FIELDS = ("model", "builder_kwargs")


def with_defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of `config` with every key it lacks from `configs/default.py`, where each default is declared.

  The rest of jaxdp reads `config.key`, never `config.get(key, fallback)`: a fallback re-typed in code
  is a second home for the default. Idempotent; the model's fields and the builder's kwargs are left alone.
  """
  full = ml_collections.ConfigDict(config.to_dict(preserve_field_references=False))
  _fill(full, default.get_config())
  return full


def _fill(config: ml_collections.ConfigDict, defaults: ml_collections.ConfigDict) -> None:
  """Adds to `config`, in place and recursively, every field of `defaults` that it lacks."""
  for key, value in defaults.items(preserve_field_references=True):
    if key not in config:
      config[key] = value
    elif (key not in _OWN_FIELDS and isinstance(value, ml_collections.ConfigDict)
          and isinstance(config[key], ml_collections.ConfigDict)):
      _fill(config[key], value)


def eval_batch_size(config: ml_collections.ConfigDict) -> int:
  """The global eval batch: `eval_batch_size`, or `batch_size` when that is 0."""
  return config.get("eval_batch_size", 0) or config.batch_size


def validate(config: ml_collections.ConfigDict, num_devices: int, num_processes: int) -> Layout:
  """Checks the fields every run needs; returns the batch layout."""
  _positive(config, "batch_size", "num_train_steps", "log_every_steps", "eval_every_steps")
  if not config.learning_rate > 0:
    raise ConfigError(f"learning_rate must be positive, got {config.learning_rate!r}")
  layout = Layout(num_devices, num_processes, config.batch_size, eval_batch_size(config))
  for key, size in (("batch_size", layout.global_batch), ("eval_batch_size", layout.eval_global_batch)):
    if size % num_devices:
      raise ConfigError(f"{key} ({size}) must be divisible by the number of devices ({num_devices})")
  accum = config.get("grad_accum_steps", 1)
  if not isinstance(accum, int) or accum < 1 or layout.per_device_batch % accum:
    raise ConfigError(f"grad_accum_steps ({accum!r}) must be a positive divisor of the per-device batch "
                      f"({layout.per_device_batch})")
  if config.parallel.get("invariant", False):
    _check_invariant(config, layout, accum)
  clip = config.get("max_grad_norm", 0.0)
  if isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0:
    raise ConfigError(f"max_grad_norm must be a number >= 0 (0: no clipping), got {clip!r}")
  smoothing = config.get("label_smoothing", 0.0)
  if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0 <= smoothing < 1:
    raise ConfigError(f"label_smoothing must be a number in [0, 1), got {smoothing!r}")
  flat = config.parallel.get("flat_allreduce", "auto")
  if str(flat).lower() not in ("auto", "true", "false"):
    raise ConfigError(f"parallel.flat_allreduce must be auto, true or false, got {flat!r}")
  bucket = config.parallel.get("bucket_bytes", 25 * 2**20)
  if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 1:
    raise ConfigError(f"parallel.bucket_bytes must be a positive integer, got {bucket!r}")
  for key, value in (("dtype", config.get("dtype", "float32")),
                     ("parallel.allreduce_dtype", config.parallel.get("allreduce_dtype", "float32"))):
    if value not in DTYPES:
      raise ConfigError(f"unknown {key} {value!r} (choose from {', '.join(DTYPES)})")
  return layout


def _check_invariant(config: ml_collections.ConfigDict, layout: Layout, accum: int) -> None:
  """The invariant mode's fixed micro-shards (a power of two, shared by the devices) and what it cannot serve."""
  m = config.parallel.get("invariant_shards", 8)
  if not isinstance(m, int) or m < 1 or m & (m - 1):
    raise ConfigError(f"parallel.invariant_shards must be a power of two, got {m!r}")
  if m % layout.num_devices or layout.num_devices & (layout.num_devices - 1):
    raise ConfigError(f"parallel.invariant needs a power-of-two device count dividing invariant_shards ({m}), "
                      f"got {layout.num_devices} devices")
  if layout.global_batch % (m * accum):
    raise ConfigError(f"batch_size ({layout.global_batch}) must be divisible by parallel.invariant_shards ({m}) "
                      f"x grad_accum_steps ({accum})")
  if layout.eval_global_batch % m:
    raise ConfigError(f"eval batch size ({layout.eval_global_batch}) must be divisible by parallel.invariant_shards "
                      f"({m}) in invariant mode")
  if config.parallel.get("shard_optimizer_state", False):
    raise ConfigError("parallel.invariant and parallel.shard_optimizer_state cannot be combined")
  if config.parallel.get("allreduce_dtype", "float32") != "float32":  # Rounding subtree sums would depend on N.
    raise ConfigError(f"parallel.invariant gathers float32 subtree sums; parallel.allreduce_dtype="
                      f"{config.parallel.allreduce_dtype!r} would round them at points that depend on the device count")
  if config.model.get("bn_axis_name", None):  # Statistics over the devices' micro-shards at once depend on N.
    raise ConfigError(f"parallel.invariant cannot serve synchronized BatchNorm (model.bn_axis_name="
                      f"{config.model.bn_axis_name!r}); set model.bn_axis_name=None")


def _positive(config: ml_collections.ConfigDict, *keys: str) -> None:
  for key in keys:
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ConfigError(f"{key} must be a positive integer, got {value!r}")
