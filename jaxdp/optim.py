"""The optax optimizer, learning-rate schedule and weight-decay mask named by the config (defaults filled)."""

import re
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import optax

from jaxdp.config import ConfigError

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
SCHEDULES = ("constant", "cosine")
MASKS = ("rank>=2", "all")  # Any other weight_decay_mask is a regular expression searched in parameter paths.

PyTree = Any


def peak_learning_rate(config: ml_collections.ConfigDict) -> float:
  """`learning_rate`, scaled by batch_size / base_batch_size when base_batch_size > 0 (linear scaling rule)."""
  base = config.base_batch_size
  if not isinstance(base, int) or isinstance(base, bool) or base < 0:
    raise ConfigError(f"base_batch_size must be a non-negative integer, got {base!r}")
  return config.learning_rate * config.batch_size / base if base else config.learning_rate


def schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup to the peak learning rate, then constant or cosine decay to 0 at `num_train_steps`."""
  lr, warmup, total = peak_learning_rate(config), config.warmup_steps, config.num_train_steps
  kind = config.lr_schedule
  if kind not in SCHEDULES:
    raise ConfigError(f"unknown lr_schedule {kind!r} (choose from {', '.join(SCHEDULES)})")
  if kind == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total, warmup + 1))
  if warmup:
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)], [warmup])
  return optax.constant_schedule(lr)


def parameter_path(path: tuple) -> str:
  """A parameter's path as the mask's regex sees it: keys joined by "/", e.g. "blocks/0/fc/kernel"."""
  return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def decay_mask(spec: str, params: PyTree) -> PyTree | None:
  """Which parameters decay, as bools shaped like `params` (None: all of them).

  `params` must have the ORIGINAL shapes (arrays or `jax.ShapeDtypeStruct`s): ZeRO-1 ravels every leaf of
  the optimizer's view to rank 1, so a mask computed from what the optimizer sees would decay nothing.
  """
  if spec == "all":
    return None
  if spec == "rank>=2":  # Matrices, convolution kernels, embeddings; not biases or norm scales (GPT-2, ResNet).
    return jax.tree.map(lambda p: len(p.shape) >= 2, params)
  try:
    pattern = re.compile(spec)
  except (re.error, TypeError) as e:
    raise ConfigError(f"weight_decay_mask {spec!r} is neither {' nor '.join(MASKS)} nor a regular expression ({e})")
  mask = jax.tree_util.tree_map_with_path(lambda path, _: bool(pattern.search(parameter_path(path))), params)
  if not any(jax.tree.leaves(mask)):  # A typo would otherwise silently turn weight decay off.
    paths = [parameter_path(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    raise ConfigError(f"weight_decay_mask {spec!r} matches no parameter path (they look like {', '.join(paths[:3])})")
  return mask


def _mask(config: ml_collections.ConfigDict, params: PyTree | None) -> PyTree | Callable | None:
  """The mask for optax: a pytree from the original shapes when known, else computed from what optax sees."""
  spec = config.weight_decay_mask
  if params is not None:
    return decay_mask(spec, params)
  return None if spec == "all" else lambda seen: decay_mask(spec, seen)


def make(config: ml_collections.ConfigDict, params: PyTree | None = None) -> optax.GradientTransformation:
  """The optimizer `config.optimizer` with the config's schedule and masked weight decay.

  `params`: the parameters or their shapes (`jax.eval_shape`), from which the decay mask is computed; required
  for a correct mask under ZeRO-1, whose optimizer sees every leaf raveled.
  """
  name, lr = config.optimizer, schedule(config)
  wd, momentum = config.weight_decay, config.momentum
  mask = _mask(config, params)  # Validated even when weight decay is off; passed only when it is on.
  mask = mask if wd else None    # (No mask wrapper at all: the optimizer state keeps its old structure.)
  if name == "adamw":
    return optax.adamw(lr, weight_decay=wd, mask=mask)
  if name == "adam":
    tx = optax.adam(lr)
  elif name == "sgd":
    tx = optax.sgd(lr)
  elif name == "momentum":
    tx = optax.sgd(lr, momentum=momentum, nesterov=config.nesterov)
  else:
    raise ConfigError(f"unknown optimizer {name!r} (choose from {', '.join(OPTIMIZERS)})")
  return optax.chain(optax.add_decayed_weights(wd, mask), tx) if wd else tx
