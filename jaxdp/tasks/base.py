"""The task seam: what a task returns (`Metric`, per example), the model it is handed, and how jaxdp reduces it."""

import collections
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from jaxdp.config import ConfigError

KINDS = ("mean", "sum", "max")  # How a metric combines: weighted mean over elements, sum, maximum.
# Mergeable sums of metrics: a mean is its "mean" (Σ w·v) over its "weight"; "negative" counts its weights below 0.
GROUPS = ("mean", "weight", "sum", "max", "negative")
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
  if len(out) != len(metrics) + 1:  # Keys whose str() is "loss" or another key's.
    names = collections.Counter(["loss", *map(str, metrics)])
    colliding = sorted((k for k in metrics if names[str(k)] > 1), key=repr)
    raise ConfigError(f"task metric keys {colliding} name one metric twice: each is reported as "
                      "str(key), and 'loss' is the loss's")
  if out["loss"].reduce != "mean":  # The gradient is the mean's: a summed loss would not combine as one.
    raise ConfigError(f"the task's loss must reduce by mean, got reduce={out['loss'].reduce!r}")
  return out


def by_kind(metrics: Mapping[str, Metric]) -> dict[str, dict[str, jax.Array]]:
  """A micro-batch's metrics as mergeable float32 scalars (`strategies.base.Scalars`): `per_row` over all rows."""
  rows = per_row(metrics, jnp.ones(jnp.shape(metrics["loss"].values)[:1], bool))
  return {group: {k: reduce_rows(group, v) for k, v in rows[group].items()} for group in GROUPS}


def means(sums: Mapping[str, Mapping[str, jax.Array]]) -> dict[str, jax.Array]:
  """{name: Σ w·v / Σ w} of each mean metric's global sums; 0 where its total weight is 0 (nothing to average)."""
  weights = sums["weight"]
  return {k: jnp.where(weights[k] > 0, s / jnp.where(weights[k] > 0, weights[k], 1), 0) for k, s in sums["mean"].items()}


def flatten(grouped: Mapping[str, Mapping[str, jax.Array]]) -> dict[str, jax.Array]:
  """{kind: {name: x}} -> {name: x}."""
  return {k: v for kind in KINDS for k, v in grouped[kind].items()}


def reduce_rows(group: str, rows: jax.Array) -> jax.Array:
  """[rows] -> one value: the maximum for the "max" group, the sum for every other group."""
  return rows.max() if group == "max" else rows.sum()


def per_row(metrics: Mapping[str, Metric], real: jax.Array) -> dict[str, Any]:
  """Each metric's GROUPS per row ([B]) over its elements, and "num_examples"; a padded row 0 (max: -inf)."""
  # No gradient flows through a weight: it says how much an element counts, as a mask does.
  out: dict[str, Any] = {**{group: {} for group in GROUPS}, "num_examples": real.astype(jnp.int32)}
  for name, m in metrics.items():
    v = m.values.astype(jnp.float32)
    mask = jnp.broadcast_to(real.reshape(real.shape + (1,) * (v.ndim - 1)), v.shape)
    if m.reduce == "max":
      out["max"][name] = _rows(jnp.where(mask, v, -jnp.inf), jnp.max)
      continue
    w = jnp.ones_like(v) if m.weights is None else jax.lax.stop_gradient(
        jnp.broadcast_to(m.weights, v.shape).astype(jnp.float32))
    out[m.reduce][name] = _rows(jnp.where(mask, v * w, 0.0), jnp.sum)
    if m.reduce == "mean":
      out["weight"][name] = _rows(jnp.where(mask, w, 0.0), jnp.sum)
      out["negative"][name] = _rows(jnp.where(mask & (w < 0), 1.0, 0.0), jnp.sum)
  return out


def refuse_negative(counts: Mapping[str, Any], where: str) -> None:
  """ConfigError naming the first mean metric with negative weights (`counts`: their number by name) and `where`."""
  for name, count in sorted(counts.items(), key=lambda kv: kv[0] != "loss"):  # The loss first, as ever.
    if count > 0:
      raise ConfigError(f"metric {name!r} has {int(count)} negative weights at {where}: a weight is a mean's "
                        "normalizer (a mask, a count); a signed per-example factor (an advantage) belongs in the loss "
                        "(docs/tasks.md#weights)")


def combine(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
  """Two eval sums (of rows, devices or batches) as one: max for the "max" group, sums for the rest."""
  return {k: jax.tree.map(jnp.maximum if k == "max" else jnp.add, a[k], b[k]) for k in a}


def _rows(x: jax.Array, reduce: Callable) -> jax.Array:
  """[B, ...] -> [B]: one value per example (over its elements)."""
  return reduce(x.reshape(x.shape[0], -1), axis=-1)
