"""Invariant mode's promise at its edges: BatchNorm statistics under accumulation, on 1 and 8 devices."""

import jax
import numpy as np
import pytest

from jaxdp import train


@pytest.fixture
def bn_config(config):
  """A linen BatchNorm model in invariant mode, one step on a batch of 64."""
  config.model = type(config.model)({"name": "user_models:LinenBNNet", "width": 16})
  config.parallel.invariant = True
  config.num_train_steps, config.log_every_steps, config.batch_size = 1, 1, 64
  return config


def _stats(config, workdir):
  result = train.train_and_evaluate(config, str(workdir))
  return result.backend.get(result.state.model_state)["batch_stats"]["BatchNorm_0"]


def test_batchnorm_statistics_under_accumulation_are_the_mean_over_micro_batches(bn_config, tmp_path):
  """After one step from running mean 0, the running mean is 0.1 x the batch's mean, however the batch is cut."""
  whole = _stats(bn_config, tmp_path / "whole")
  bn_config.grad_accum_steps = 2
  accumulated = _stats(bn_config, tmp_path / "accumulated")
  assert np.abs(whole["mean"]).max() > 1e-3  # Something to compare: the statistic moved.
  np.testing.assert_allclose(accumulated["mean"], whole["mean"], rtol=1e-5, atol=1e-7)
