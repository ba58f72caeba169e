"""One adapter gives Flax NNX and linen modules the same pure `init` / `apply`.

The train step then sees only pytrees: `params` (what the optimizer trains) and `model_state`
(everything else the module keeps, e.g. BatchNorm statistics), both plain nested dicts.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen, nnx

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Model:
  """A module as two pure functions.

  init(rng) -> (params, model_state)
  apply(params, model_state, inputs, *, train, rng) -> (outputs, new_model_state)
  """
  init: Callable[[jax.Array], tuple[PyTree, PyTree]]
  apply: Callable[..., tuple[jax.Array, PyTree]]


def from_nnx(cls: type[nnx.Module], kwargs: dict[str, Any]) -> Model:
  """Wraps an NNX module class, built as `cls(**kwargs, rngs=nnx.Rngs(rng))`."""
  abstract = nnx.eval_shape(lambda: cls(**kwargs, rngs=nnx.Rngs(0)))
  graphdef, abstract_params, abstract_rest = nnx.split(abstract, nnx.Param, ...)

  def init(rng: jax.Array) -> tuple[PyTree, PyTree]:
    _, params, rest = nnx.split(cls(**kwargs, rngs=nnx.Rngs(rng)), nnx.Param, ...)
    return nnx.to_pure_dict(params), nnx.to_pure_dict(rest)

  def apply(params: PyTree, model_state: PyTree, inputs: jax.Array, *, train: bool,
            rng: jax.Array | None = None) -> tuple[jax.Array, PyTree]:
    del rng  # NNX modules carry their own RNG streams in model_state.
    module = nnx.merge(graphdef, _fill(abstract_params, params), _fill(abstract_rest, model_state))
    module.train() if train else module.eval()
    outputs = module(inputs)
    _, _, rest = nnx.split(module, nnx.Param, ...)
    return outputs, nnx.to_pure_dict(rest)

  return Model(init, apply)


def _fill(abstract: nnx.State, values: PyTree) -> nnx.State:
  """A fresh State shaped like `abstract` holding `values` (the template is never mutated)."""
  state = jax.tree.map(lambda x: x, abstract)
  nnx.replace_by_pure_dict(state, values)
  return state


def from_linen(module: linen.Module, sample_inputs: jax.Array) -> Model:
  """Wraps a linen module whose `__call__` takes `train: bool`."""

  def init(rng: jax.Array) -> tuple[PyTree, PyTree]:
    variables = module.init({"params": rng, "dropout": rng}, sample_inputs, train=False)
    variables = dict(variables)
    return variables.pop("params", {}), variables

  def apply(params: PyTree, model_state: PyTree, inputs: jax.Array, *, train: bool,
            rng: jax.Array | None = None) -> tuple[jax.Array, PyTree]:
    variables = {"params": params, **model_state}
    rngs = {"dropout": rng} if rng is not None else None
    if train and model_state:
      outputs, updates = module.apply(variables, inputs, train=True, rngs=rngs, mutable=list(model_state))
      return outputs, {**model_state, **updates}
    return module.apply(variables, inputs, train=train, rngs=rngs), model_state

  return Model(init, apply)


def sample_inputs(input_shape: tuple[int, ...], batch: int = 1) -> jax.Array:
  """A zero batch of inputs, for shape inference."""
  return jnp.zeros((batch, *input_shape), jnp.float32)
