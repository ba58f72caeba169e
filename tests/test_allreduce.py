"""The plain strategy's all-reduce: the gradient sum, leaf by leaf, and the metrics' sums and weights in float32;
none on one device."""

import numpy as np
import pytest

from jaxdp import build, data
from jaxdp.tools import inspect
from jaxdp.configs import mlp_digits

SCALARS = 24  # Loss and accuracy, each a float32 sum, its float32 weight and its count of negative weights.


def _config(data_dir, **parallel):
  config = mlp_digits.get_config()
  config.dataset.data_dir = data_dir
  config.model.hidden = (64,)
  config.batch_size = 64
  config.parallel.update(parallel)
  return config


@pytest.fixture(scope="module")
def analyzed(data_dir):
  cache = {}

  def run(**parallel):
    key = tuple(sorted(parallel.items()))
    if key not in cache:
      cache[key] = inspect.analyze(_config(data_dir, **parallel))
    return cache[key]

  return run


def test_one_all_reduce_per_gradient_leaf_and_metric_sum(analyzed):
  lowered = analyzed()["collectives"]["lowered"]["all-reduce"]
  assert lowered["count"] == 4 + 6  # One per leaf (two kernels, two biases); loss and accuracy: sum, weight, negatives.
  assert (lowered["tensor_bytes"], lowered["scalar_bytes"]) == (analyzed()["params"]["bytes"], SCALARS)


def test_one_device_has_no_collective(analyzed):
  r = analyzed(num_devices=1)
  for program in ("compiled", "lowered"):
    assert all(r["collectives"][program][k]["count"] == 0 for k in inspect.KINDS), r["collectives"][program]


def _two_steps(config):
  parts = build.build(config)
  state = parts.backend.init(parts.init)
  batches = data.train_batches(parts.ds, "train", seed=0, global_batch=config.batch_size, start_step=0,
                               process_index=0, process_count=1)
  metrics = []
  for _ in range(2):
    state, m = parts.train_step(state, parts.backend.put_step(next(batches)))
    metrics.append(parts.backend.get(m))
  return parts.backend.get(state.params), metrics


def test_a_bfloat16_all_reduce_keeps_loss_and_accuracy_float32(data_dir):
  # 24 rows per device: accuracies such as 7/24 are not bfloat16 numbers, so rounding them would show.
  # The first step's metrics come from the same parameters whatever the all-reduce dtype.
  config = _config(data_dir, allreduce_dtype="bfloat16")
  config.batch_size = 8 * 24
  _, bf16 = _two_steps(config)
  config.parallel.allreduce_dtype = "float32"
  _, f32 = _two_steps(config)
  for key in ("loss", "accuracy"):
    assert bf16[0][key].dtype == np.float32
    np.testing.assert_allclose(bf16[0][key], f32[0][key], rtol=1e-6, err_msg=key)
