"""The NaN guard's stop rule counts CONSECUTIVE skipped steps: isolated NaN steps never stop a run."""

import re

import batches
import numpy as np
import pytest

from jaxdp import data, train
from jaxdp.loop import step_metrics
from jaxdp.loop.step_metrics import NonFiniteError, StepMetrics
from jaxdp.wrap import MAX_STEPS_IN_FLIGHT, steps_in_flight
from jaxdp.report import metrics


def _poison(config, monkeypatch, steps: set[int]) -> None:
  """Global batches whose index is in `steps` get NaN inputs (so a NaN loss on every device)."""
  real = data.train_batches

  def poisoned(*args, start_step: int, **kwargs):
    return batches.nan_inputs_at(real(*args, start_step=start_step, **kwargs), steps, start_step)

  monkeypatch.setattr(data, "train_batches", poisoned)


def test_isolated_nonfinite_steps_do_not_stop_training(config, tmp_path, monkeypatch):
  _poison(config, monkeypatch, {1, 3, 5, 7})  # Never two in a row.
  config.num_train_steps, config.log_every_steps = 10, 10
  monkeypatch.setattr(step_metrics, "MAX_CONSECUTIVE_NONFINITE", 2)
  train.train_and_evaluate(config, str(tmp_path))
  logged = [r for r in metrics.read(str(tmp_path)) if "train/nonfinite" in r]
  assert logged[-1]["step"] == 10 and sum(r["train/nonfinite"] for r in logged) == 4


def test_consecutive_nonfinite_steps_stop_training(config, tmp_path, monkeypatch):
  _poison(config, monkeypatch, {1, 4, 5})
  config.num_train_steps = 10
  monkeypatch.setattr(step_metrics, "MAX_CONSECUTIVE_NONFINITE", 2)
  with pytest.raises(train.NonFiniteError, match="2 consecutive steps"):
    train.train_and_evaluate(config, str(tmp_path))


class _HostBackend:
  """A backend stand-in whose metrics are host numbers already: what StepMetrics does with them, alone."""

  def __init__(self, platform: str = "cpu"):
    self.platform, self.fetches = platform, 0

  def get(self, tree):
    self.fetches += 1
    return tree


def test_without_log_steps_the_guard_still_reads_the_metrics_every_fetch_every_steps(monkeypatch):
  monkeypatch.setattr(step_metrics, "MAX_CONSECUTIVE_NONFINITE", 3)
  backend = _HostBackend()
  tracker = StepMetrics(backend)
  for step in range(1, StepMetrics.FETCH_EVERY):
    tracker.push(step, {"loss": 1.0, "nonfinite": 0})
  assert backend.fetches == 0 and len(tracker.pending) == StepMetrics.FETCH_EVERY - 1
  tracker.push(StepMetrics.FETCH_EVERY, {"loss": 1.0, "nonfinite": 0})
  assert backend.fetches == 1 and tracker.pending == []  # Memory stays bounded.
  with pytest.raises(NonFiniteError, match="3 consecutive steps"):  # And a NaN run stops a run that never logs.
    for step in range(StepMetrics.FETCH_EVERY + 1, 3 * StepMetrics.FETCH_EVERY):
      tracker.push(step, {"loss": float("nan"), "nonfinite": 1})


def test_steps_in_flight_are_bounded_on_cpu_only():
  assert steps_in_flight(_HostBackend("cpu")) == MAX_STEPS_IN_FLIGHT > 0
  assert steps_in_flight(_HostBackend("gpu")) == steps_in_flight(_HostBackend("tpu")) == 0


def test_the_nan_guard_names_the_example_ids_of_the_skipped_batches(config, tmp_path, monkeypatch, caplog):
  """NaN rows in in-memory arrays: the error and the log name the ids (row positions) of each skipped batch. Seen
  failing with `StepMetrics(backend)` in loop/train.py (no ids given): the error said "step 1: unknown"."""
  rng = np.random.default_rng(0)
  inputs = rng.normal(size=(256, 8)).astype(np.float32)
  bad = [17, 200]
  inputs[bad] = np.nan
  arrays = {"inputs": inputs, "labels": rng.integers(0, 3, 256)}
  config.num_train_steps, config.batch_size = 8, 32  # One epoch: each row in exactly one step's batch.
  monkeypatch.setattr(step_metrics, "MAX_CONSECUTIVE_NONFINITE", 1)  # The first skipped step stops the run.
  with caplog.at_level("WARNING", logger="jaxdp"), pytest.raises(NonFiniteError) as raised:
    train.train_and_evaluate(config, str(tmp_path), train_data=arrays, eval_data=arrays)
  named = re.search(r"step (\d+): ([\d, ]+)$", str(raised.value))
  ids = {int(i) for i in named.group(2).split(", ")}
  assert len(ids) == 32 and ids & set(bad)  # The whole batch of the step, which holds a NaN row.
  logged = [r.getMessage() for r in caplog.records if "update skipped" in r.getMessage()]
  assert logged == [f"step {named.group(1)}: loss or gradients NaN/Inf, update skipped; its batch's example ids: "
                    f"{named.group(2)}"]
