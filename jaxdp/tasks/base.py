"""The task seam: what a task returns (`Metric`), the model it is handed (`BoundModel`), and how jaxdp reduces.

A task is `task(model, batch) -> (loss, metrics)` on one replica's rows; loss and metrics are per-example
(or per-element) values. Reducing them (over a micro-batch, real eval rows, devices, batches) is jaxdp's
job, by each metric's kind, so every strategy keeps its guarantees for any task.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from jaxdp.config import ConfigError

KINDS = ("mean", "sum", "max")  # How a metric combines: weighted mean over elements, sum, maximum.
PyTree = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Metric:
  """Per-example values [B] or per-element values [B, ...], with optional weights and how they reduce."""
  values: jax.Array
  weights: jax.Array | None = None  # Broadcastable to values; None: every element weighs 1.
  reduce: str = dataclasses.field(default="mean", metadata={"static": True})  # One of KINDS.


class Task(Protocol):
  """`task(model, batch) -> (loss, {name: metric})`; optional `headline`, `num_outputs`, `finalize` attributes."""

  def __call__(self, model: "BoundModel", batch: dict[str, jax.Array]) -> tuple[Any, Mapping[str, Any]]: ...


class BoundModel:
  """The model's apply with parameters, state, rng and train flag bound; remembers the state it returns."""

  def __init__(self, apply: Callable[..., tuple[Any, PyTree]], params: PyTree, model_state: PyTree, *,
               train: bool, rng: jax.Array | None, dtype: Any, cast_inputs: bool):
    self._apply, self._params, self._rng, self._dtype, self._cast = apply, params, rng, dtype, cast_inputs
    self.train = train
    self.state = model_state  # After a call: the model state that call returned (e.g. new BatchNorm statistics).

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    """The model's outputs on these inputs; float inputs cast to the compute dtype (not token ids)."""
    args, kwargs = jax.tree.map(self._cast_input, (args, kwargs))
    outputs, self.state = self._apply(self._params, self.state, *args, train=self.train, rng=self._rng, **kwargs)
    return outputs

  def _cast_input(self, x: Any) -> Any:
    if self._cast and isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating):
      return x.astype(self._dtype)
    return x


def as_metric(name: str, value: Any) -> Metric:
  """A task's returned value as a Metric (an array is an unweighted mean); ConfigError naming a bad one."""
  metric = value if isinstance(value, Metric) else Metric(jnp.asarray(value))
  if metric.reduce not in KINDS:
    raise ConfigError(f"task metric {name!r}: reduce must be one of {', '.join(KINDS)}, got {metric.reduce!r}")
  if jnp.ndim(metric.values) < 1:
    raise ConfigError(f"task metric {name!r} must have per-example values [B] or [B, ...], got a scalar")
  return metric


def run(task: Task, model: BoundModel, batch: dict[str, jax.Array]) -> dict[str, Metric]:
  """The task on one replica's rows: {"loss": ..., <its metrics>} as Metrics (the loss a mean)."""
  loss, metrics = task(model, batch)
  out = {"loss": as_metric("loss", loss), **{str(k): as_metric(str(k), v) for k, v in dict(metrics).items()}}
  if len(out) != len(metrics) + 1:
    raise ConfigError(f"task metric keys {sorted((k for k in metrics if str(k) == 'loss' or [str(j) for j in metrics].count(str(k)) > 1), key=repr)} name one metric twice: each is reported as str(key), and 'loss' is the loss's")
  if out["loss"].reduce != "mean":  # The gradient is the mean's: a summed loss would not combine as one.
    raise ConfigError(f"the task's loss must reduce by mean, got reduce={out['loss'].reduce!r}")
  return out


def scalar(metric: Metric) -> jax.Array:
  """A micro-batch's metric as one float32 scalar, by its kind (an unweighted mean: `jnp.mean`, as ever)."""
  v = metric.values
  if metric.reduce == "max":
    return jnp.max(v).astype(jnp.float32)
  if metric.weights is None:
    total = jnp.mean(v) if metric.reduce == "mean" else jnp.sum(v, dtype=jnp.float32)
    return total.astype(jnp.float32)
  w = jnp.broadcast_to(metric.weights, v.shape).astype(jnp.float32)
  weighted = jnp.sum(v.astype(jnp.float32) * w)
  return weighted / jnp.sum(w) if metric.reduce == "mean" else weighted


def by_kind(metrics: Mapping[str, Metric]) -> dict[str, dict[str, jax.Array]]:
  """{kind: {name: scalar}}: a micro-batch's metrics grouped by how they combine (the strategies' input)."""
  return {kind: {k: scalar(m) for k, m in metrics.items() if m.reduce == kind} for kind in KINDS}


def flatten(grouped: Mapping[str, Mapping[str, jax.Array]]) -> dict[str, jax.Array]:
  """{kind: {name: x}} -> {name: x}."""
  return {k: v for kind in KINDS for k, v in grouped[kind].items()}


def per_row(metrics: Mapping[str, Metric], real: jax.Array) -> dict[str, Any]:
  """Eval: each metric per row over its elements, real rows only, as the strategies sum (and max) rows.

  {"mean": {name: Σ w·v}, "weight": {name: Σ w}, "sum": {name: Σ v·w}, "max": {name: max}, "num_examples"}:
  each [B]. Padded rows give 0 (max: -inf), whatever the task computed on them.
  """
  out: dict[str, Any] = {"mean": {}, "weight": {}, "sum": {}, "max": {}, "num_examples": real.astype(jnp.int32)}
  for name, m in metrics.items():
    v = m.values
    mask = jnp.broadcast_to(real.reshape(real.shape + (1,) * (v.ndim - 1)), v.shape)
    if m.reduce == "max":
      out["max"][name] = _rows(jnp.where(mask, v.astype(jnp.float32), -jnp.inf), jnp.max)
      continue
    if m.weights is None:
      weighted, weight = jnp.where(mask, v, 0), mask.astype(jnp.float32)
    else:
      w = jnp.broadcast_to(m.weights, v.shape).astype(jnp.float32)
      weighted, weight = jnp.where(mask, v.astype(jnp.float32) * w, 0.0), jnp.where(mask, w, 0.0)
    out[m.reduce][name] = _rows(weighted.astype(jnp.float32), jnp.sum)
    if m.reduce == "mean":
      out["weight"][name] = _rows(weight, jnp.sum)
  return out


def combine(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
  """Two eval sums (of rows, devices or batches) as one: max for the "max" group, sums for the rest."""
  return {k: jax.tree.map(jnp.maximum if k == "max" else jnp.add, a[k], b[k]) for k in a}


def _rows(x: jax.Array, reduce: Callable) -> jax.Array:
  """[B, ...] -> [B]: one value per example (over its elements)."""
  return reduce(x.reshape(x.shape[0], -1), axis=-1)
