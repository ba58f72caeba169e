"""`config.validate`: each field it checks names its bad value in one ConfigError; the defaults pass."""

import ml_collections
import pytest

from jaxdp import config as config_lib
from jaxdp.config import ConfigError
from jaxdp.configs import default


def _config(key: str | None = None, value: object = None) -> ml_collections.ConfigDict:
  """The default config with `key` ("parallel.block_mb") set to `value`, any type (as a config file may write)."""
  fields = default.get_config().to_dict()
  if key is not None:
    *path, last = key.split(".")
    target = fields
    for part in path:
      target = target[part]
    target[last] = value
  return config_lib.with_defaults(ml_collections.ConfigDict(fields))


def test_the_defaults_pass_and_give_the_layout():
  layout = config_lib.validate(_config(), num_devices=8, num_processes=2)
  assert (layout.global_batch, layout.per_device_batch, layout.process_batch) == (128, 16, 64)


@pytest.mark.parametrize("key, value, named", [
    ("batch_size", 0, "batch_size must be a positive integer, got 0"),
    ("log_every_steps", 2.5, "log_every_steps must be a positive integer, got 2.5"),
    ("learning_rate", 0.0, "learning_rate must be positive, got 0.0"),
    ("batch_size", 100, "batch_size (100) must be divisible by the number of devices (8)"),
    ("eval_batch_size", 12, "eval_batch_size (12) must be divisible"),
    ("grad_accum_steps", 3, "grad_accum_steps (3) must be a positive divisor of the per-device batch (16)"),
    ("grad_accum_steps", 0, "grad_accum_steps (0)"),
    ("gc_every_steps", -1, "gc_every_steps must be an integer >= 0"),
    ("gc_every_steps", True, "gc_every_steps must be an integer >= 0 (0: Python's automatic collection), got True"),
    ("max_grad_norm", -1.0, "max_grad_norm must be a number >= 0"),
    ("max_grad_norm", "1", "max_grad_norm must be a number >= 0 (0: no clipping), got '1'"),
    ("label_smoothing", 1.0, "label_smoothing must be a number in [0, 1), got 1.0"),
    ("parallel.block_mb", -1, "parallel.block_mb must be a number >= 0"),
    ("parallel.resident_mb", "lots", "parallel.resident_mb must be 'auto' or a number of MiB >= 0"),
    ("dtype", "float8", "unknown dtype 'float8'"),
    ("parallel.allreduce_dtype", "int8", "unknown parallel.allreduce_dtype 'int8'"),
])
def test_each_bad_value_is_one_config_error_naming_it(key, value, named):
  with pytest.raises(ConfigError) as e:
    config_lib.validate(_config(key, value), num_devices=8, num_processes=1)
  assert named in str(e.value)


@pytest.mark.parametrize("key, value", [("parallel.resident_mb", "64"),
                                        ("parallel.block_mb", 0), ("max_grad_norm", 0), ("label_smoothing", 0.1),
                                        ("eval_batch_size", 16), ("grad_accum_steps", 16), ("dtype", "bfloat16")])
def test_good_edge_values_pass(key, value):
  config_lib.validate(_config(key, value), num_devices=8, num_processes=1)


def test_defaults_fill_jaxdps_own_fields_never_the_models_arguments():
  """A model's fields are its keyword arguments: the default model's name would be one the user never gave."""
  full = config_lib.with_defaults(ml_collections.ConfigDict({"model": {"hidden": (64,)}, "dataset": {"name": "x"}}))
  assert full.model.to_dict() == {"hidden": (64,)}
  assert full.dataset.name == "x" and full.dataset.train_split == default.get_config().dataset.train_split
