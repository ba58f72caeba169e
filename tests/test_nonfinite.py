"""The NaN guard's stop rule counts CONSECUTIVE skipped steps: isolated NaN steps never stop a run."""

import numpy as np
import pytest

from jaxdp import data, train
from jaxdp.report import metrics


def _poison(config, monkeypatch, steps: set[int]) -> None:
  """Global batches whose index is in `steps` get NaN inputs (so a NaN loss on every device)."""
  config.parallel.resident_mb = 0  # Host batches: a split held on the devices has its steps take row ids.
  real = data.train_batches

  def poisoned(*args, start_step: int, **kwargs):
    for step, batch in enumerate(real(*args, start_step=start_step, **kwargs), start_step):
      yield {**batch, "inputs": np.full_like(batch["inputs"], np.nan)} if step in steps else batch

  monkeypatch.setattr(data, "train_batches", poisoned)


def test_isolated_nonfinite_steps_do_not_stop_training(config, tmp_path, monkeypatch):
  _poison(config, monkeypatch, {1, 3, 5, 7})  # Never two in a row.
  config.num_train_steps, config.log_every_steps, config.max_consecutive_nonfinite = 10, 10, 2
  train.train_and_evaluate(config, str(tmp_path))
  logged = [r for r in metrics.read(str(tmp_path)) if "train/nonfinite" in r]
  assert logged[-1]["step"] == 10 and sum(r["train/nonfinite"] for r in logged) == 4


def test_consecutive_nonfinite_steps_stop_training(config, tmp_path, monkeypatch):
  _poison(config, monkeypatch, {1, 4, 5})
  config.num_train_steps, config.max_consecutive_nonfinite = 10, 2
  with pytest.raises(train.NonFiniteError, match="2 consecutive steps"):
    train.train_and_evaluate(config, str(tmp_path))
