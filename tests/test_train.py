"""End-to-end training: device-count and backend equivalence, identical replicas, user models."""

import jax
import numpy as np
import pytest

from jaxdp import metrics, train


def _params(result):
  return result.backend.get(result.state.params)


def _assert_trees_close(a, b, **tol):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, **tol), a, b)


@pytest.fixture
def twenty_steps(config):
  config.num_train_steps = 20
  config.log_every_steps = 10
  config.learning_rate = 1e-3
  return config


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_eight_devices_train_like_one(twenty_steps, tmp_path, backend):
  twenty_steps.parallel.backend = backend
  twenty_steps.parallel.num_devices = 1
  one = _params(train.train_and_evaluate(twenty_steps, str(tmp_path / "one")))
  twenty_steps.parallel.num_devices = 8
  eight = _params(train.train_and_evaluate(twenty_steps, str(tmp_path / "eight")))
  _assert_trees_close(one, eight, rtol=1e-5, atol=1e-6)


def test_pmap_and_mesh_give_the_same_parameters(twenty_steps, tmp_path):
  results = {}
  for backend in ("pmap", "mesh"):
    twenty_steps.parallel.backend = backend
    results[backend] = _params(train.train_and_evaluate(twenty_steps, str(tmp_path / backend)))
  _assert_trees_close(results["pmap"], results["mesh"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_all_replicas_hold_identical_parameters(config, tmp_path, backend):
  config.parallel.backend = backend
  config.model.name = "user_models:LinenBNNet"  # BatchNorm state must stay identical too.
  del config.model.hidden
  result = train.train_and_evaluate(config, str(tmp_path))
  replicas = result.backend.replicas({"params": result.state.params, "model_state": result.state.model_state})
  for leaf in jax.tree.leaves(replicas):
    assert leaf.shape[0] == 8
    for r in range(1, 8):
      np.testing.assert_array_equal(leaf[r], leaf[0])


@pytest.mark.parametrize("name, extra", [("user_models:LinenBNNet", {"width": 16}),
                                         ("user_models:NNXNet", {"in_features": 64})])
def test_user_models_of_either_api_train(config, tmp_path, name, extra):
  config.model = type(config.model)({"name": name, **extra})
  config.num_train_steps = 30
  config.log_every_steps = 10
  config.learning_rate = 1e-2
  train.train_and_evaluate(config, str(tmp_path))
  losses = [r["train/loss"] for r in metrics.read(str(tmp_path)) if "train/loss" in r]
  assert losses[-1] < 0.7 * losses[0]


def test_metrics_jsonl_has_the_contract_keys(config, tmp_path):
  config.eval_every_steps = 2
  train.train_and_evaluate(config, str(tmp_path))
  records = metrics.read(str(tmp_path))
  assert all("step" in r for r in records)
  assert [r["step"] for r in records if "train/loss" in r] == [2, 4]
  evals = [r for r in records if "eval/loss" in r]
  assert [r["step"] for r in evals] == [2, 4]
  assert all({"eval/accuracy", "eval/num_examples"} <= set(r) for r in evals)
  assert evals[-1]["eval/num_examples"] == 360
