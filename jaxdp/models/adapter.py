"""Flax NNX and linen modules as the same pure `init` / `apply` of plain dicts; randomness only from `apply`'s rng."""

import dataclasses
import zlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen, nnx

from jaxdp.config import ConfigError

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Model:
  """A module as two pure functions: `init(rng)` and `apply(params, model_state, *inputs, train, rng=None)`."""
  init: Callable[[jax.Array], tuple[PyTree, PyTree]]
  apply: Callable[..., tuple[jax.Array, PyTree]]


def from_nnx(cls: type[nnx.Module], kwargs: dict[str, Any]) -> Model:
  """Wraps an NNX module class, built as `cls(**kwargs, rngs=nnx.Rngs(rng))`; its RNG streams are not model state."""
  abstract = nnx.eval_shape(lambda: cls(**kwargs, rngs=nnx.Rngs(0)))

  def init(rng: jax.Array) -> tuple[PyTree, PyTree]:
    _, params, _, rest = nnx.split(cls(**kwargs, rngs=nnx.Rngs(rng)), nnx.Param, nnx.RngState, ...)
    return nnx.to_pure_dict(params), nnx.to_pure_dict(rest)

  return _nnx_model(abstract, init)


def from_nnx_instance(module: nnx.Module) -> Model:
  """Wraps a built NNX module, never changed: its current parameters and state are the run's init, whatever the seed."""
  _, params, _, rest = nnx.split(module, nnx.Param, nnx.RngState, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  abstract = nnx.eval_shape(lambda: nnx.merge(*nnx.split(module)))  # A shape-only copy: no device buffers kept.

  def init(rng: jax.Array) -> tuple[PyTree, PyTree]:
    del rng  # The module's own values are the init.
    return jax.tree.map(jnp.asarray, params), jax.tree.map(jnp.asarray, rest)

  return _nnx_model(abstract, init)


def _nnx_model(abstract: nnx.Module, init: Callable[[jax.Array], tuple[PyTree, PyTree]]) -> Model:
  """The pure `apply` of an NNX module shaped like `abstract`, with `init`."""
  graphdef, abstract_params, abstract_rngs, abstract_rest = nnx.split(abstract, nnx.Param, nnx.RngState, ...)
  tags = sorted({v.tag for v in jax.tree.leaves(abstract_rngs, is_leaf=lambda v: isinstance(v, nnx.Variable))})

  def apply(params: PyTree, model_state: PyTree, *args: Any, train: bool, rng: jax.Array | None = None,
            **kwargs: Any) -> tuple[Any, PyTree]:
    rngs = jax.tree.map(_placeholder, abstract_rngs)
    module = nnx.merge(graphdef, _fill(abstract_params, params), rngs, _fill(abstract_rest, model_state))
    if rng is not None and tags:  # Each stream (dropout, default, ...) from its own key derived from `rng`.
      nnx.reseed(module, policy="match_shape", **{t: _stream_key(rng, t) for t in tags})
    module.train() if train else module.eval()
    outputs = module(*args, **kwargs)
    _, _, _, rest = nnx.split(module, nnx.Param, nnx.RngState, ...)
    return outputs, nnx.to_pure_dict(rest)

  return Model(init, apply)


def _stream_key(rng: jax.Array, tag: str) -> jax.Array:
  """A key per stream name, so that `dropout` and `default` never draw the same bits."""
  return jax.random.fold_in(rng, zlib.crc32(tag.encode()) & 0x7FFFFFFF)


def _placeholder(x: jax.ShapeDtypeStruct) -> jax.Array:
  """A stand-in value for an RNG-state leaf (typed key or count), overwritten by `nnx.reseed` before use."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    return jnp.broadcast_to(jax.random.key(0), x.shape)
  return jnp.zeros(x.shape, x.dtype)


def _fill(abstract: nnx.State, values: PyTree) -> nnx.State:
  """A fresh State shaped like `abstract` holding `values` (the template is never mutated)."""
  state = jax.tree.map(lambda x: x, abstract)
  nnx.replace_by_pure_dict(state, values)
  return state


def from_linen(module: linen.Module, sample_inputs: jax.Array | None = None,
               sample_call: tuple[tuple, dict] | None = None) -> Model:
  """Wraps a linen module taking `train: bool`, initialized on `sample_inputs` or on zeros shaped as `sample_call`."""
  if sample_call is None:
    sample_call = ((sample_inputs,), {})
  args, kwargs = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), sample_call)

  def init(rng: jax.Array) -> tuple[PyTree, PyTree]:
    variables = module.init({"params": rng, "dropout": rng}, *args, train=False, **kwargs)
    variables = dict(variables)
    return variables.pop("params", {}), variables

  def apply(params: PyTree, model_state: PyTree, *args: Any, train: bool, rng: jax.Array | None = None,
            **kwargs: Any) -> tuple[Any, PyTree]:
    variables = {"params": params, **model_state}
    rngs = {"dropout": rng} if rng is not None else None
    if train and model_state:
      outputs, updates = module.apply(variables, *args, train=True, rngs=rngs, mutable=list(model_state), **kwargs)
      return outputs, {**model_state, **updates}
    return module.apply(variables, *args, train=train, rngs=rngs, **kwargs), model_state

  return Model(init, apply)


def linen_call(module: linen.Module, task: Callable, element_spec: dict[str, jax.ShapeDtypeStruct]) -> tuple[tuple, dict]:
  """The (args, kwargs) shapes `task` calls `module` with on one abstract example, traced: what linen's init needs."""
  calls = []

  class Probe:
    """Stands for the bound model: records the call and answers with the module's abstract outputs."""
    train = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
      calls.append(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (args, kwargs)))
      key = jax.random.PRNGKey(0)
      return module.init_with_output({"params": key, "dropout": key}, *args, train=False, **kwargs)[0]

  batch = {k: jax.ShapeDtypeStruct((1, *v.shape), v.dtype) for k, v in element_spec.items()}
  jax.eval_shape(lambda b: task(Probe(), b), batch)
  if not calls:
    raise ConfigError(f"task {getattr(task, '__name__', task)!r} never calls the model: a linen module is "
                      f"initialized on the inputs the task feeds it")
  return calls[0]
