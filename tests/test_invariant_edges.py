"""Invariant mode's promise at its edges: BatchNorm statistics under accumulation; deterministic GPU ops."""

import os

import jax
import numpy as np
import pytest

from jaxdp import parallel, strategies, train
from jaxdp.runtime import process


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


class _Bogus(strategies.Invariant):
  """Invariant, with a compile option XLA does not know: seen failing only if the backend passes it on."""

  @classmethod
  def compiler_options(cls, platform: str) -> dict:
    return {"xla_cpu_no_such_option": True}


def test_invariant_steps_compile_with_the_strategy_s_options_deterministic_ops_on_gpus():
  assert strategies.Invariant.compiler_options("gpu") == {"xla_gpu_deterministic_ops": True}
  assert strategies.Invariant.compiler_options("cpu") is None and strategies.DataParallel.compiler_options("gpu") is None
  backend = parallel.make_backend("mesh", 2, _Bogus)
  batch = {"x": np.ones(4, np.float32)}
  step = backend.map_eval(lambda state, batch, axis: jax.numpy.sum(batch["x"]))
  with pytest.raises(Exception, match="No such compile option: 'xla_cpu_no_such_option'"):
    step({}, backend.put_batch(batch))
  train_step = backend.map_train(lambda state, batch, axis: (state, jax.numpy.sum(batch["x"])))
  with pytest.raises(Exception, match="No such compile option: 'xla_cpu_no_such_option'"):
    train_step({}, backend.put_step(batch))


def test_the_process_sets_deterministic_gpu_ops_first_in_xla_flags_before_jax_starts(config, monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
  process.deterministic_gpu(config, started=False)  # Plain data parallelism: XLA's defaults.
  assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
  config.parallel.invariant = True
  process.deterministic_gpu(config, started=True)  # Too late for flags: the compile options hold it.
  assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
  process.deterministic_gpu(config, started=False)
  assert os.environ["XLA_FLAGS"] == "--xla_gpu_deterministic_ops=true --xla_dump_to=/tmp/x"
  process.deterministic_gpu(config, started=False)  # Once.
  assert os.environ["XLA_FLAGS"] == "--xla_gpu_deterministic_ops=true --xla_dump_to=/tmp/x"
