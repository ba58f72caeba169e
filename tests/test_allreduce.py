"""The plain strategy's gradient all-reduce with parallel.flat_allreduce: one flat buffer (or one per bucket)
holding the gradients, loss and accuracy; none on one device; the same results as the per-leaf pmean."""

import math
import re

import jax
import numpy as np
import pytest

from jaxdp import build, data
from jaxdp.tools import inspect
from jaxdp.config import ConfigError
from jaxdp.strategies import base, plain
from jaxdp.configs import mlp_digits

SCALARS = 8  # Loss and accuracy, two float32 scalars, ride in the gradient buffer.


def _config(data_dir, **parallel):
  parallel = {"flat_allreduce": "true", **parallel}  # "auto" flattens only across processes (gloo).
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


def test_cpu_step_all_reduces_one_buffer_of_the_parameters_and_scalars(analyzed):
  r = analyzed()
  p = r["params"]["bytes"]
  for program in ("compiled", "lowered"):
    ops = r["collectives"][program]
    assert (ops["all-reduce"]["count"], ops["all-reduce"]["bytes"]) == (1, p + SCALARS), (program, ops)
    assert all(ops[k]["count"] == 0 for k in inspect.KINDS if k != "all-reduce"), ops


def test_per_leaf_all_reduce_when_flat_is_off(analyzed):
  lowered = analyzed(flat_allreduce="false")["collectives"]["lowered"]["all-reduce"]
  assert lowered["count"] == 2 + 4  # Loss, accuracy and one per leaf (two kernels, two biases).
  assert (lowered["tensor_bytes"], lowered["scalar_bytes"]) == (analyzed()["params"]["bytes"], SCALARS)


def test_small_buckets_cut_the_buffer_into_ceil_bytes_over_bucket_all_reduces(analyzed):
  r = analyzed(bucket_bytes=4000)
  lowered, p = r["collectives"]["lowered"]["all-reduce"], r["params"]["bytes"]
  assert (lowered["count"], lowered["bytes"]) == (math.ceil((p + SCALARS) / 4000), p + SCALARS), lowered


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
    state, m = parts.train_step(state, parts.backend.put_batch(next(batches)))
    metrics.append(parts.backend.get(m))
  return parts.backend.get(state.params), metrics


@pytest.mark.parametrize("parallel", [{"flat_allreduce": "false"}, {"num_devices": 1}])
def test_flat_buffers_give_the_per_leaf_and_one_device_results(data_dir, parallel):
  flat, flat_metrics = _two_steps(_config(data_dir, bucket_bytes=4000))
  other, other_metrics = _two_steps(_config(data_dir, **parallel))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), flat, other)
  for a, b in zip(flat_metrics, other_metrics):
    np.testing.assert_allclose([a["loss"], a["accuracy"]], [b["loss"], b["accuracy"]], rtol=1e-6)


def test_a_bfloat16_flat_all_reduce_keeps_loss_and_accuracy_float32(data_dir):
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


@pytest.mark.parametrize("key,value", [("flat_allreduce", "maybe"), ("bucket_bytes", 0)])
def test_bad_settings_are_config_errors(data_dir, key, value):
  config = _config(data_dir)
  config.parallel[key] = value
  with pytest.raises(ConfigError, match=f"parallel.{key}"):
    build.build(config)


def test_auto_flattens_only_across_cpu_processes(monkeypatch):
  assert (base.flat_allreduce("auto"), base.flat_allreduce("true"), base.flat_allreduce(False)) == (False, True, False)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  assert base.flat_allreduce("auto")


def test_the_flat_buffer_is_one_unfused_concatenate():
  """XLA:CPU copies an unfused concatenate leaf by leaf; fused (a 1-D buffer of raveled leaves) it walks a tree
  of operand bounds for every element, 10-30x slower (experiments/xla_cpu_collectives.md)."""
  mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2], axis_types=(jax.sharding.AxisType.Auto,))
  spec = jax.sharding.PartitionSpec()
  reduce = jax.shard_map(lambda t: plain.flat_all_reduce_mean(t, "data"), mesh=mesh, in_specs=spec, out_specs=spec)
  tree = [np.ones((64, 32), np.float32), np.ones((32,), np.float32), np.ones((32, 10), np.float32), np.float32(1)]
  entry = jax.jit(reduce).lower(tree).compile().as_text().split("\nENTRY ")[1]
  assert re.search(r"= f32\[1,\d+\]\{1,0\} concatenate\(", entry), entry  # In the entry computation, not a fusion.
