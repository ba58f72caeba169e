"""What `jaxdp.DataParallel` makes of a user's pieces: a module as a `Model`, a step bounded in flight, a loss's
gradient reduced over the global batch."""

import collections
import functools
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen, nnx

from jaxdp import parallel, strategies
from jaxdp.config import ConfigError
from jaxdp.models import adapter
from jaxdp.tasks import base as task_lib

PyTree = Any
# Unfinished steps on CPU before the host waits for the oldest. Why: docs/design-notes.md#steps-in-flight
MAX_STEPS_IN_FLIGHT = 2


def steps_in_flight(backend: parallel.Backend) -> int:
  """MAX_STEPS_IN_FLIGHT on CPU; 0 (unbounded) on GPU and TPU, whose runtimes bound their own queue."""
  return MAX_STEPS_IN_FLIGHT if backend.platform == "cpu" else 0


def bounded(step: Callable, backend: parallel.Backend) -> Callable:
  """`step`, waiting for the oldest of its unfinished calls beyond `steps_in_flight` (CPU only): simulated CPU
  devices deadlock in their collectives when hundreds of steps are queued."""
  limit = steps_in_flight(backend)
  if not limit:
    return step
  pending: collections.deque = collections.deque()

  @functools.wraps(step)
  def call(state: PyTree, batch: PyTree) -> Any:
    out = step(state, batch)
    # A metric: never donated by the next call, as the state is. A step that returns none is not bounded.
    pending.extend(jax.tree.leaves(out[1])[:1] if isinstance(out, tuple) and len(out) == 2 else [])
    while len(pending) > limit:
      pending.popleft().block_until_ready()
    return out

  call.lower = step.lower  # What ahead-of-time compiling and cost analysis call.
  return call


def value_and_grad(loss_fn: Callable[..., Any], strategy: strategies.Strategy,
                   axis: strategies.DataAxis) -> Callable[..., tuple[jax.Array, PyTree]]:
  """`loss_fn(params, batch, *args)` -> per-example losses as `(params, batch, *args) -> (loss, grads)` over the
  global batch: Σw·ℓ/Σw and its gradient, reduced across devices by `strategy`."""
  def reduced(params: PyTree, batch: PyTree, *args: Any) -> tuple[jax.Array, PyTree]:
    def grad_fn(params: PyTree, model_state: PyTree, micro: PyTree, rng: jax.Array) -> tuple:
      def total(params: PyTree) -> tuple[jax.Array, dict]:
        sums = task_lib.by_kind({"loss": task_lib.as_metric("loss", loss_fn(params, micro, *args))})
        return sums["mean"]["loss"], sums
      (loss, sums), grads = jax.value_and_grad(total, has_aux=True)(params)
      return (loss, (sums, model_state)), grads

    # The strategy marks the parameters varying itself (`DataAxis.vary`): `grad` then stays local and its
    # reduction is the only one, never N times the gradient.
    holder = types.SimpleNamespace(params=params, model_state={})  # What a strategy reads of a state.
    sums, _, grads = strategy.gradients(grad_fn, holder, batch, jax.random.PRNGKey(0), axis)
    weight = sums["weight"]["loss"]
    inverse = 1 / jnp.where(weight > 0, weight, 1)  # One reciprocal, then products, as `step.train_step`.
    return task_lib.means(sums)["loss"], jax.tree.map(lambda g: g * inverse, grads)

  return reduced


def model(module: Any, inputs: Any) -> adapter.Model:
  """An NNX module (class or instance), a linen module or a `Model` as jaxdp's pure `Model`."""
  if isinstance(module, adapter.Model):
    return module
  if isinstance(module, nnx.Module):
    return adapter.from_nnx_instance(module)
  if isinstance(module, type) and issubclass(module, nnx.Module):
    return adapter.from_nnx(module, {})
  if isinstance(module, linen.Module):
    if inputs is None:
      raise ConfigError(f"a linen module ({type(module).__name__}) is initialized on inputs: dp.init(..., inputs=x)")
    return adapter.from_linen(module, jnp.asarray(inputs))
  raise ConfigError(f"model {module!r} is not a Flax NNX module (a class or an instance) or a linen module instance")
