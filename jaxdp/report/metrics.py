"""Host-side metric writers, the default trackers (`jaxdp.loop.hooks`): `metrics.jsonl` and TensorBoard event
files in the workdir, process 0 only."""

import glob
import json
import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxdp.loop.hooks import Hook

METRICS_FILE = "metrics.jsonl"
EVENTS_GLOB = "events.out.tfevents.*"


class JsonlWriter(Hook):
  """Appends one JSON object per line ({"step": ..., "train/loss": ...}); a no-op off process 0."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, METRICS_FILE)
    self.enabled = jax.process_index() == 0

  def on_write(self, step: int, scalars: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), **{k: _json_value(v) for k, v in scalars.items()}}
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")

  def close(self) -> None:
    """Nothing buffered: every record is on disk once `on_write` returns."""


class TensorBoardWriter(Hook):
  """TensorBoard event files in the workdir (`tensorboard --logdir WORKDIR`); a no-op off process 0.

  Uses TensorBoard's numpy-only `tensorboard.summary.Writer` over `EventFile`: TensorFlow is never loaded.
  """

  def __init__(self, workdir: str):
    self.enabled = jax.process_index() == 0
    self._writer = None
    if self.enabled:
      from tensorboard.summary import Writer as EventWriter  # Only process 0 pays for the imports.

      from jaxdp.report.event_file import EventFile
      self._writer = EventWriter(EventFile(workdir))

  def on_write(self, step: int, scalars: Mapping[str, float]) -> None:
    if self._writer is None:
      return
    for key, value in scalars.items():
      if is_number(value):
        self._writer.add_scalar(key, float(value), int(step))
    self._writer.flush()  # Periodic and small: flushing keeps the files current if the run dies.

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None


def trackers(workdir: str, tensorboard: bool = True) -> list[Hook]:
  """The default trackers: metrics.jsonl plus (optionally) TensorBoard event files; both write on process 0 only."""
  return [JsonlWriter(workdir)] + ([TensorBoardWriter(workdir)] if tensorboard else [])


def read(workdir: str) -> list[dict]:
  """All records of a workdir's metrics.jsonl."""
  with open(os.path.join(workdir, METRICS_FILE)) as f:
    return [json.loads(line) for line in f if line.strip()]


def read_tensorboard(workdir: str) -> dict[str, list[tuple[int, float]]]:
  """Every scalar in a workdir's TensorBoard event files: tag -> [(step, value), ...] in file order."""
  from tensorboard.backend.event_processing import event_file_loader
  scalars: dict[str, list[tuple[int, float]]] = {}
  for path in sorted(glob.glob(os.path.join(workdir, EVENTS_GLOB))):
    for event in event_file_loader.EventFileLoader(path).Load():
      for value in event.summary.value:
        number = value.tensor.float_val[0] if value.HasField("tensor") else value.simple_value
        scalars.setdefault(value.tag, []).append((int(event.step), float(number)))
  return scalars


COUNTS = ("nonfinite", "zero_weight", "overflow")  # Per-step counts of skipped updates: summed over steps.
LAST = ("loss_scale",)  # State after the steps, not a statistic of them: the last step's value.


def mean(history: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, float]:
  """Per-step train metrics over several steps, named `prefix/key`: counts summed, state last, the rest averaged.

  A metric with a total weight per step (`history[i]["weight"]`, a mean's) is Σ w·v / Σ w over all the steps'
  examples, and left out where they weigh nothing; sums and maxima are averaged over steps.
  """
  out = {}
  for k in history[0]:
    if k == "weight":
      continue
    values = np.array([h[k] for h in history], np.float64)
    if k in COUNTS:
      out[f"{prefix}/{k}"] = float(values.sum())
    elif k in LAST:
      out[f"{prefix}/{k}"] = float(values[-1])
    elif k in history[0].get("weight", {}):
      weights = np.array([h["weight"][k] for h in history], np.float64)
      if weights.sum() > 0:
        out[f"{prefix}/{k}"] = float((values * weights).sum() / weights.sum())
    else:
      out[f"{prefix}/{k}"] = float(values.mean())
  return out


def summarize_eval(sums: Mapping[str, Any], task: Any = None) -> dict[str, float]:
  """Eval sums by kind (`jaxdp.tasks.base.per_row`, reduced) -> `eval/<name>` of each task metric, `eval/num_examples`.

  A mean is its weighted sum over its weight (per element: per example, or per token); then the task's
  `finalize` adds metrics derived from the reduced ones. Names starting with "_" are helpers, not reported.
  """
  scalars = {name: _ratio(float(total), float(sums["weight"][name])) for name, total in sums["mean"].items()}
  scalars.update({name: float(v) for group in ("sum", "max") for name, v in sums[group].items()})
  scalars = dict(sorted(scalars.items(), key=lambda kv: kv[0] != "loss"))  # The loss first, as ever.
  finalize = getattr(task, "finalize", None)
  if finalize is not None:
    scalars.update(finalize(dict(scalars)))
  out: dict[str, float] = {f"eval/{k}": v for k, v in scalars.items() if not k.startswith("_")}
  out["eval/num_examples"] = int(sums["num_examples"])
  return out


def _ratio(total: float, weight: float) -> float:
  return total / weight if weight else float("nan")


def is_number(value: object) -> bool:
  """Whether `value` is one real number (a bool or an array of more than one is not)."""
  return isinstance(value, numbers.Number | np.generic | np.ndarray) and not isinstance(value, bool) \
      and np.ndim(value) == 0


def _json_value(value: object) -> object:
  """A numpy scalar or 0-d array as the Python number json can write."""
  return value.item() if isinstance(value, np.generic | np.ndarray) else value
