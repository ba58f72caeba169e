"""The optax optimizer and learning-rate schedule named by the config."""

import ml_collections
import optax

from jaxdp.config import ConfigError

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
SCHEDULES = ("constant", "cosine")


def peak_learning_rate(config: ml_collections.ConfigDict) -> float:
  """`learning_rate`, scaled by batch_size / base_batch_size when base_batch_size > 0 (linear scaling rule)."""
  base = config.get("base_batch_size", 0)
  if not isinstance(base, int) or isinstance(base, bool) or base < 0:
    raise ConfigError(f"base_batch_size must be a non-negative integer, got {base!r}")
  return config.learning_rate * config.batch_size / base if base else config.learning_rate


def schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup to the peak learning rate, then constant or cosine decay to 0 at `num_train_steps`."""
  lr, warmup, total = peak_learning_rate(config), config.get("warmup_steps", 0), config.num_train_steps
  kind = config.get("lr_schedule", "constant")
  if kind not in SCHEDULES:
    raise ConfigError(f"unknown lr_schedule {kind!r} (choose from {', '.join(SCHEDULES)})")
  if kind == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total, warmup + 1))
  if warmup:
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)], [warmup])
  return optax.constant_schedule(lr)


def make(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """The optimizer `config.optimizer` with the config's schedule and weight decay."""
  name, lr = config.optimizer, schedule(config)
  wd, momentum = config.get("weight_decay", 0.0), config.get("momentum", 0.9)
  if name == "adamw":
    return optax.adamw(lr, weight_decay=wd)
  if name == "adam":
    tx = optax.adam(lr)
  elif name == "sgd":
    tx = optax.sgd(lr)
  elif name == "momentum":
    tx = optax.sgd(lr, momentum=momentum, nesterov=config.get("nesterov", False))
  else:
    raise ConfigError(f"unknown optimizer {name!r} (choose from {', '.join(OPTIMIZERS)})")
  return optax.chain(optax.add_decayed_weights(wd), tx) if wd else tx
