"""Host-side metric writers: `metrics.jsonl` in the workdir, written by process 0 only."""

import json
import os
from collections.abc import Mapping, Sequence

import jax
import numpy as np

METRICS_FILE = "metrics.jsonl"


class JsonlWriter:
  """Appends one JSON object per line ({"step": ..., "train/loss": ...}); a no-op off process 0."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, METRICS_FILE)
    self.enabled = jax.process_index() == 0

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), **{k: _plain(v) for k, v in scalars.items()}}
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")


def read(workdir: str) -> list[dict]:
  """All records of a workdir's metrics.jsonl."""
  with open(os.path.join(workdir, METRICS_FILE)) as f:
    return [json.loads(line) for line in f if line.strip()]


def mean(history: Sequence[Mapping[str, np.ndarray]], prefix: str) -> dict[str, float]:
  """Averages per-step train metrics, named `prefix/key`."""
  return {f"{prefix}/{k}": float(np.mean([h[k] for h in history])) for k in history[0]}


def summarize_eval(sums: Mapping[str, np.ndarray]) -> dict[str, float]:
  """Eval sums -> `eval/loss`, `eval/accuracy`, `eval/num_examples`."""
  n = int(sums["num_examples"])
  return {"eval/loss": float(sums["loss_sum"]) / n, "eval/accuracy": float(sums["correct"]) / n,
          "eval/num_examples": n}


def _plain(value: object) -> object:
  return value.item() if isinstance(value, np.generic | np.ndarray) else value
