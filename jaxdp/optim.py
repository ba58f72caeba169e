"""The optax optimizer (named by the config, or an object), with the config's schedule and weight-decay mask."""

import inspect
import re
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import optax

from jaxdp.config import ConfigError

OPTIMIZERS = ("sgd", "adam", "adamw", "lion", "adafactor")  # Examples: any optax optimizer works.
SCHEDULES = ("constant", "cosine")
MASKS = ("rank>=2", "all")  # Any other weight_decay_mask is a regular expression searched in parameter paths.

PyTree = Any
# The optimizer of a run that only reads parameters (jaxdp.evaluate, jaxdp.sample): stateless, and never applied.
NONE = optax.set_to_zero()


def schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup to `learning_rate`, then constant or cosine decay to 0 at `num_train_steps`."""
  lr, warmup, total = config.learning_rate, config.warmup_steps, config.num_train_steps
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
  """Which parameters decay, as bools shaped like `params` (None: all); ZeRO-1 needs the original shapes here."""
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


def make(config: ml_collections.ConfigDict, params: PyTree | None = None,
         optimizer: optax.GradientTransformation | None = None) -> optax.GradientTransformation:
  """`optimizer`, or config.optimizer's GradientTransformation, or the optax function it names configured by the config.

  `params` (or their shapes): the decay mask's source, needed under ZeRO-1, whose optimizer sees raveled leaves.
  """
  if optimizer is None and isinstance(config.optimizer, optax.GradientTransformation):  # As if passed.
    optimizer = config.optimizer
  if optimizer is not None:
    if not isinstance(optimizer, optax.GradientTransformation):
      raise ConfigError(f"optimizer must be an optax GradientTransformation (e.g. optax.adamw(1e-3)), got "
                        f"{type(optimizer).__name__}")
    return optimizer
  name, wd = config.optimizer, config.weight_decay
  # The mask from the original shapes when known, else from what optax sees (raveled under ZeRO-1). Validated even
  # when weight decay is off; passed only when it is on, so that the optimizer state then has no mask wrapper.
  spec = config.weight_decay_mask
  lazy = None if spec == "all" else lambda seen: decay_mask(spec, seen)
  mask = decay_mask(spec, params) if params is not None else lazy
  mask = mask if wd else None
  fn, takes = _optax_function(name)
  kwargs = dict(config.optimizer_kwargs)
  given = {"learning_rate": schedule(config)}
  decoupled = "weight_decay" in takes  # Otherwise L2: the decay added to the gradient, as for adam and sgd.
  if decoupled:
    given.update({k: v for k, v in (("weight_decay", wd), ("mask", mask)) if k in takes})
  clash = sorted(kwargs.keys() & given.keys())
  if clash:
    raise ConfigError(f"optimizer_kwargs sets {', '.join(clash)}: set the config's own key instead")
  try:
    tx = fn(**given, **kwargs)
  except TypeError as e:
    raise ConfigError(f"optimizer_kwargs {kwargs!r} do not fit optax.{name}: {e}") from None
  return optax.chain(optax.add_decayed_weights(wd, mask), tx) if wd and not decoupled else tx


def _optax_function(name: Any) -> tuple[Callable[..., optax.GradientTransformation], set[str]]:
  """The optax optimizer function `name` ("lion") and its parameters' names; a ConfigError naming it otherwise."""
  if name == "momentum":  # jaxdp's own name once, not optax's.
    raise ConfigError('optimizer "momentum" was removed: set optimizer="sgd" with optimizer_kwargs='
                      '{"momentum": 0.9, "nesterov": False}')
  fn = getattr(optax, name, None) if isinstance(name, str) and not name.startswith("_") else None
  takes = set(inspect.signature(fn).parameters) if inspect.isfunction(fn) else set()
  if "learning_rate" not in takes:
    raise ConfigError(f"unknown optimizer {name!r}: config.optimizer names an optax optimizer taking a learning rate "
                      f"(e.g. {', '.join(OPTIMIZERS)}), or is an optax GradientTransformation "
                      f"(config.optimizer = optax.lion(1e-4))")
  return fn, takes


def injected_learning_rate(opt_state: PyTree) -> Any | None:
  """The `hyperparams['learning_rate']` an optimizer state carries (`optax.inject_hyperparams`: the rate its last
  update used), where it is (on the devices); None where the state carries none, or several (a chain of two)."""
  found = []

  def carries(node: Any) -> bool:
    hyperparams = getattr(node, "hyperparams", None)
    if isinstance(hyperparams, dict) and "learning_rate" in hyperparams:
      found.append(hyperparams["learning_rate"])
      return True  # A leaf: its own states (`hyperparams_states`: a schedule's count) are not searched.
    return False

  jax.tree.leaves(opt_state, is_leaf=carries)
  return found[0] if len(found) == 1 else None
