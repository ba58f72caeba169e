"""The default trackers, `metrics.jsonl` and TensorBoard event files in the workdir (process 0), and their readers."""

import json
import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxdp.report.hook import Hook

METRICS_FILE = "metrics.jsonl"


class JsonlWriter(Hook):
  """Appends one JSON object per line ({"step": ..., "train/loss": ...}); a no-op off process 0."""
  keeps_identifiers = True  # The records' strings (`data/digest`) too: other trackers get numbers only.

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, METRICS_FILE)
    self.enabled = jax.process_index() == 0

  def on_write(self, step: int, scalars: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    # A numpy scalar or 0-d array as the Python number json can write.
    record = {"step": int(step), **{k: v.item() if isinstance(v, np.generic | np.ndarray) else v
                                    for k, v in scalars.items()}}
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")


class TensorBoardWriter(Hook):
  """TensorBoard event files in the workdir, written without TensorFlow (`EventFile`); a no-op off process 0."""

  def __init__(self, workdir: str):
    self._writer = None
    if jax.process_index() == 0:
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


def trackers(workdir: str) -> list[Hook]:
  """The default trackers: metrics.jsonl and TensorBoard event files; both write on process 0 only."""
  return [JsonlWriter(workdir), TensorBoardWriter(workdir)]


def read(workdir: str) -> list[dict]:
  """All records of a workdir's metrics.jsonl."""
  with open(os.path.join(workdir, METRICS_FILE)) as f:
    return [json.loads(line) for line in f if line.strip()]


COUNTS = ("nonfinite", "zero_weight", "overflow")  # Per-step counts of skipped updates: summed over steps.
LAST = ("loss_scale",)  # State after the steps, not a statistic of them: the last step's value.


def mean(history: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, float]:
  """Per-step train metrics over several steps as `prefix/key`: counts summed, state last, a weighted mean's
  Σ w·v / Σ w (left out where nothing weighs), the rest averaged."""
  out = {}
  for k in (k for k in history[0] if k != "weight"):
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
  """Eval sums by kind -> `eval/<name>` (a mean over its weight; then the task's `finalize`; "_" names left out)."""
  weights = {name: float(w) for name, w in sums["weight"].items()}
  scalars = {name: float(total) / weights[name] if weights[name] else float("nan")  # NaN where nothing weighs.
             for name, total in sums["mean"].items()}
  scalars.update({name: float(v) for group in ("sum", "max") for name, v in sums[group].items()})
  scalars = dict(sorted(scalars.items(), key=lambda kv: kv[0] != "loss"))  # The loss first, as ever.
  if (finalize := getattr(task, "finalize", None)) is not None:
    scalars.update(finalize(dict(scalars)))
  out: dict[str, float] = {f"eval/{k}": v for k, v in scalars.items() if not k.startswith("_")}
  out["eval/num_examples"] = int(sums["num_examples"])
  return out


def is_number(value: object) -> bool:
  """Whether `value` is one real number (a bool or an array of more than one is not)."""
  return isinstance(value, numbers.Number | np.generic | np.ndarray) and not isinstance(value, bool) \
      and np.ndim(value) == 0
