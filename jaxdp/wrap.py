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
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxdp import parallel, strategies
from jaxdp import step as step_lib
from jaxdp.config import ConfigError
from jaxdp.models import adapter
from jaxdp.tasks import base as task_lib

PyTree = Any
# Unfinished steps on CPU before the host waits for the oldest. Why: docs/design-notes.md#steps-in-flight
MAX_STEPS_IN_FLIGHT = 2


def steps_in_flight(backend: parallel.Backend) -> int:
  """MAX_STEPS_IN_FLIGHT on CPU; 0 (unbounded) on GPU and TPU, whose runtimes bound their own queue."""
  return MAX_STEPS_IN_FLIGHT if backend.platform == "cpu" else 0


def bounded(step: Callable, backend: parallel.Backend, watch: Callable[[Any], tuple[Any, Any]] | None = None,
            report: Callable[[Any, int], None] | None = None) -> Callable:
  """`step`, waiting for the oldest of its unfinished calls beyond `steps_in_flight` (CPU only): simulated CPU
  devices deadlock in their collectives when hundreds of steps are queued. `watch(out)` -> (what the call returns,
  a part handed to `report(host value, call number)` once computed, never waited for beyond that bound)."""
  limit = steps_in_flight(backend)
  if not limit and watch is None:
    return step
  pending: collections.deque = collections.deque()  # (call number, a metric to wait on, the watched part)
  calls = 0

  @functools.wraps(step)
  def call(state: PyTree, batch: PyTree) -> Any:
    nonlocal calls
    out, calls = step(state, batch), calls + 1
    out, watched = watch(out) if watch is not None else (out, None)
    # A metric: never donated by the next call, as the state is. A step that returns none is not bounded.
    first = jax.tree.leaves(out[1])[:1] if isinstance(out, tuple) and len(out) == 2 else []
    if first or watched is not None:
      pending.append((calls, first, watched))
    while pending and (0 < limit < len(pending) or _ready(pending[0])):
      number, first, watched = pending.popleft()
      jax.block_until_ready(first)
      if watched is not None:
        report(watched, number)
    return out

  call.lower = step.lower  # What ahead-of-time compiling and cost analysis call.
  return call


def _ready(entry: tuple) -> bool:
  """Whether a pending call's watched part is computed (a call that watches nothing is waited for by the bound)."""
  return entry[2] is not None and all(x.is_ready() for x in jax.tree.leaves(entry[2]))


def train_step(mapped: Callable, backend: parallel.Backend,
               first: Callable[[Any], None] = lambda state: None) -> Callable:
  """`dp.train_step`'s mapped step, bounded, its metrics without `negative_weight`, which refuses negative weights
  once computed (`tasks.base.refuse_negative`), naming the step; `first(state)` checks before the first call."""
  start: list[int] = []  # The state's step at the first call: the steps are named from it.

  def step(state: Any, batch: PyTree) -> tuple:
    if not start:
      first(state)
      start.append(int(backend.get(state.step)))
    return mapped(state, batch)

  def negatives(out: tuple) -> tuple:
    state, metrics = out
    return (state, {k: v for k, v in metrics.items() if k != "negative_weight"}), metrics["negative_weight"]

  step.lower = mapped.lower
  return bounded(step, backend, negatives, lambda counts, number: task_lib.refuse_negative(
      backend.get(counts), f"step {start[0] + number}"))


def check_outputs(model: adapter.Model, task: Any, ds: Any, state: Any, backend: parallel.Backend) -> None:
  """ConfigError where a classification task's labels (0 .. the dataset's classes - 1) run past the model's outputs:
  their cross-entropy would be NaN. Checked on shapes, on the host: nothing waits for the devices."""
  spec = ds and ds.element_spec().get("inputs")
  if spec is None or not hasattr(task, "num_outputs") or ds.float_labels or not ds.num_classes:
    return
  stacked = isinstance(backend, parallel.PmapBackend)  # Its leaves carry a leading [local_devices] axis.
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:] if stacked else x.shape, x.dtype),
                        (state.params, state.model_state))
  try:
    logits = jax.eval_shape(lambda p, s, x: model.apply(p, s, x, train=False)[0], *shapes,
                            jax.ShapeDtypeStruct((1, *spec.shape), spec.dtype))
  except Exception:  # noqa: BLE001  (a model this probe cannot call: its step says what fails, as without the probe)
    return
  width = jax.tree.leaves(logits)[0].shape[-1] if jax.tree.leaves(logits) else None
  if width is not None and width < ds.num_classes:
    raise ConfigError(f"the model gives {width} outputs per example, but the labels of {ds.name} run to "
                      f"{ds.num_classes - 1} ({ds.num_classes} classes): a label past the logits makes the loss NaN; "
                      f"give the model {ds.num_classes} outputs")


def user_step(fn: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]], backend: parallel.MeshBackend) -> Callable:
  """`@dp.step`: `fn` on every device, unchecked, compiled, state donated, bounded; its `value_and_grad` calls'
  negative weights refused once computed, naming the call."""
  guarded, names = _guarded(fn)
  # Unchecked: checked, `grad` of the P() state would already sum over devices, and the habit `pmean(grad)`
  # would give N times the gradient.
  mapped = jax.shard_map(parallel.select(guarded), mesh=backend.mesh,
                         in_specs=(P(), (P(None, parallel.AXIS), P())), out_specs=P(), check_vma=False)

  def negatives(out: tuple) -> tuple:
    state, (metrics, counts) = out
    return (state, metrics), (counts if names else None)  # Named once traced; no loss, nothing to read.

  def refuse(counts: jax.Array, number: int) -> None:
    by_name: dict[str, int] = {}  # Two calls of one loss function: one name.
    for name, count in zip(names, jax.device_get(counts)):
      by_name[name] = by_name.get(name, 0) + int(count)
    task_lib.refuse_negative(by_name, f"call {number} of {getattr(fn, '__name__', 'the step')}")

  return bounded(jax.jit(mapped, donate_argnums=0), backend, negatives, refuse)


def example_keys(key: jax.Array, batch: PyTree) -> jax.Array:
  """Inside `@dp.step`: a key per row of this device's `batch`, `fold_in(key, the row's place in the global batch)`:
  an example's draws are the same on any device count. Fold the step into `key` first."""
  rows = jax.tree.leaves(batch)[0].shape[0]
  # Rows are laid out over the devices in order (P('data')): device d holds rows d * rows ... (d + 1) * rows - 1.
  first = lax.axis_index(parallel.AXIS) * rows
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(first + jnp.arange(rows))


# Each `@dp.step` being traced: the (loss name, negative weights, total weight) of every `value_and_grad` in it.
_TRACING: list[list[tuple[str, jax.Array, jax.Array]]] = []


def _guarded(fn: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]]) -> tuple[Callable, list[str]]:
  """`fn(state, batch) -> (state, metrics)` as `-> (state, (metrics, negative weights by loss))`, and those losses'
  names (known once traced). As `step.train_step`: where a `value_and_grad` batch weighs 0 the state is kept and
  a dict of metrics gains `zero_weight`."""
  names: list[str] = []

  def step(state: PyTree, batch: PyTree) -> tuple:
    _TRACING.append([])
    try:
      new, metrics = fn(state, batch)
    finally:
      seen = _TRACING.pop()
    names[:] = [name for name, _, _ in seen]
    if not seen:
      return new, (metrics, jnp.zeros((0,), jnp.int32))
    zero = jnp.any(jnp.stack([weight == 0 for _, _, weight in seen]))
    if _types(new) == _types(state):  # Kept as it came in; a cond, not a select fused into the update.
      new = lax.cond(zero, lambda: state, lambda: new)
    if isinstance(metrics, dict):
      metrics = {**metrics, "zero_weight": zero.astype(jnp.int32)}
    return new, (metrics, jnp.stack([negative for _, negative, _ in seen]).astype(jnp.int32))

  return step, names


def _types(tree: PyTree) -> tuple:
  return jax.tree.structure(tree), [jax.typeof(x) for x in jax.tree.leaves(tree)]


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

    # In `@dp.step` (unchecked: `axis` marks nothing varying) `grad` stays local, and the strategy's reduction is
    # the only one, never N times the gradient.
    holder = types.SimpleNamespace(params=params, model_state={})  # What a strategy reads of a state.
    sums, _, grads = strategy.gradients(grad_fn, holder, batch, jax.random.PRNGKey(0), axis)
    weight = sums["weight"]["loss"]
    if _TRACING:  # Refused (negative weights) and skipped (no weight) by the `@dp.step` it is in.
      _TRACING[-1].append((getattr(loss_fn, "__name__", "loss"), sums["negative"]["loss"], weight))
    return task_lib.means(sums)["loss"], step_lib.normalize(grads, weight)

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
