"""The suite's standard for two trainings being the same (tests/same_training.py): rounding passes, a training
that differs does not."""

import numpy as np
import pytest

import same_training


@pytest.fixture
def params() -> dict:
  rng = np.random.RandomState(0)
  return {"hidden": {"kernel": rng.randn(64, 256).astype(np.float32) * 0.05, "bias": rng.randn(256).astype(np.float32)},
          "head": {"kernel": rng.randn(256, 10).astype(np.float32), "bias": rng.randn(10).astype(np.float32) * 1e-3}}


def _map(tree: dict, f) -> dict:
  return {k: _map(v, f) if isinstance(v, dict) else f(k, v) for k, v in tree.items()}


def test_float_rounding_passes_and_so_does_a_near_zero_weight_off_in_its_fourth_digit(params):
  rng = np.random.RandomState(1)
  rounded = _map(params, lambda k, x: x * (1 + 1e-6 * rng.randn(*x.shape)).astype(np.float32))
  same_training.assert_same_training(rounded, params)
  kernel = params["hidden"]["kernel"]
  kernel[0, 0] = -0.0088390  # As on jax 0.12: -0.0088313 where one process had -0.0088390.
  rounded["hidden"]["kernel"][0, 0] = -0.0088313
  assert abs(-0.0088313 / -0.0088390 - 1) > same_training.RTOL
  same_training.assert_same_training(rounded, params)


def test_every_weight_off_by_1e_4_is_another_training(params):
  with pytest.raises(AssertionError, match="relative L2 distance"):
    same_training.assert_same_training(_map(params, lambda k, x: x * np.float32(1 + 1e-4)), params)


def test_one_large_weight_of_a_small_leaf_off_by_1_percent_is_another_training(params):
  """The head's bias is small beside the kernels: the whole tree's distance barely moves, the element check sees it."""
  changed = _map(params, lambda k, x: x.copy())
  bias = changed["head"]["bias"]
  bias[np.abs(bias).argmax()] *= 1.01
  assert same_training.distance(changed, params) < same_training.REL_L2
  with pytest.raises(AssertionError, match="head.*bias"):
    same_training.assert_same_training(changed, params)


def test_another_tree_fails(params):
  with pytest.raises(AssertionError):
    same_training.assert_same_training({**params, "extra": np.zeros(3, np.float32)}, params)
