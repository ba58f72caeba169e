"""Models: built-in NNX modules, any NNX / linen class named by "package.module:ClassName", or a module object."""

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import linen, nnx

from jaxdp import config as config_lib
from jaxdp.config import ConfigError
from jaxdp.models.adapter import Model, from_linen, from_nnx, from_nnx_instance, linen_call

BUILTIN = {
    "mlp": "jaxdp.models.mlp:MLP",
    "cnn": "jaxdp.models.cnn:CNN",
    "resnet": "jaxdp.models.resnet:ResNet",
    "gpt": "jaxdp.models.gpt:GPT",
}

__all__ = ["Model", "get_model", "BUILTIN"]
# What a module object passed from Python is, in place of a name: NNX or linen, a class or an instance.
ModuleLike = type[nnx.Module] | type[linen.Module] | nnx.Module | linen.Module


def get_model(config: ml_collections.ConfigDict, input_shape: tuple[int, ...], num_classes: int,
              module: ModuleLike | None = None, *, task: Any = None,
              element_spec: dict[str, Any] | None = None) -> Model:
  """`module` (an NNX instance as it is), else `config.name`'s class built with `config`'s other fields, and the
  dataset's `input_shape` and `num_classes` where it takes them and the config sets none."""
  if isinstance(module, nnx.Module):
    return from_nnx_instance(module)
  if isinstance(module, linen.Module):
    return _linen(module, input_shape, task, element_spec)
  if module is not None and not (inspect.isclass(module) and issubclass(module, (nnx.Module, linen.Module))):
    raise ConfigError(f"model {module!r} is not a Flax NNX or linen Module (a class, or an instance)")
  cls = module or resolve(config.name)
  name = config.name if module is None else module.__qualname__
  kwargs = {k: v for k, v in config.to_dict().items() if k != "name"}
  accepted = inspect.signature(cls.__init__ if issubclass(cls, nnx.Module) else cls).parameters
  for key, value in (("input_shape", tuple(input_shape)), ("num_classes", num_classes)):
    if key in accepted and key not in kwargs:
      kwargs[key] = value
  try:
    if issubclass(cls, nnx.Module):
      return from_nnx(cls, kwargs)
    return _linen(cls(**kwargs), input_shape, task, element_spec)
  except TypeError as e:  # Wrong kwargs for the class: a config mistake.
    raise ConfigError(f"model {name!r} does not accept the config's fields: {e}") from None


def _linen(module: linen.Module, input_shape: tuple[int, ...], task: Any,
           element_spec: dict[str, Any] | None) -> Model:
  """A linen module, initialized on the task's inputs when the task and features are known, else on `input_shape`."""
  if task is None or element_spec is None:
    return from_linen(module, jax.ShapeDtypeStruct((1, *input_shape), jnp.float32))  # Zeros of this shape.
  return from_linen(module, sample_call=linen_call(module, task, element_spec))


def resolve(name: str) -> type[Any]:
  """The NNX or linen class for a built-in name or "package.module:ClassName"."""
  path = BUILTIN.get(name, name)
  if ":" not in path:
    raise ConfigError(f"unknown model {name!r} (built-in: {', '.join(BUILTIN)}; or 'package.module:ClassName')")
  cls = config_lib.import_named(path, "model")
  if not (inspect.isclass(cls) and issubclass(cls, (nnx.Module, linen.Module))):
    raise ConfigError(f"model {name!r} is not a Flax NNX or linen Module class")
  return cls
