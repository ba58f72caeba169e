"""Scale-up features train like plain data parallelism: accumulation, ZeRO-1, mixed precision."""

import re

import jax
import numpy as np
import pytest
import runs

from jaxdp import build, config as config_lib, data, parallel, train
from jaxdp.report import flops, metrics


def _train(config, workdir):
  result = train.train_and_evaluate(config, str(workdir))
  return result, result.backend.get(result.state.params)


def _close(a, b, **tol):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, **tol), a, b)


@pytest.fixture
def ten_steps(config):
  config.num_train_steps, config.log_every_steps, config.checkpoint_every_steps = 10, 5, 0
  config.batch_size = 64
  return config


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_accumulation_matches_one_big_step(ten_steps, tmp_path, backend):
  ten_steps.parallel.backend = backend
  _, plain = _train(ten_steps, tmp_path / "plain")
  ten_steps.grad_accum_steps = 4  # 8 examples per device -> 4 micro-batches of 2.
  _, accumulated = _train(ten_steps, tmp_path / "accum")
  _close(plain, accumulated, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_zero1_matches_unsharded(ten_steps, tmp_path, optimizer):
  ten_steps.optimizer, ten_steps.weight_decay = optimizer, 0.1
  _, plain = _train(ten_steps, tmp_path / "plain")
  ten_steps.parallel.shard_optimizer_state = True
  result, sharded = _train(ten_steps, tmp_path / "zero")
  _close(plain, sharded, rtol=1e-5, atol=1e-6)
  mu = jax.tree.leaves(result.state.opt_state)[1]  # Adam's first moment of the first leaf.
  assert mu.sharding.spec == jax.sharding.PartitionSpec("data")
  assert mu.addressable_shards[0].data.size == mu.size // 8  # Each device holds 1/8.


def test_zero1_resumes_from_its_checkpoint(ten_steps, tmp_path):
  ten_steps.parallel.shard_optimizer_state = True
  ten_steps.checkpoint_every_steps = 5
  _, straight = _train(ten_steps, tmp_path / "straight")
  ten_steps.num_train_steps = 5
  train.train_and_evaluate(ten_steps, str(tmp_path / "resumed"))
  ten_steps.num_train_steps = 10
  _, resumed = _train(ten_steps, tmp_path / "resumed")
  jax.tree.map(np.testing.assert_array_equal, straight, resumed)


def test_bfloat16_compute_and_allreduce_train_like_float32(ten_steps, tmp_path):
  ten_steps.num_train_steps, ten_steps.learning_rate = 30, 1e-2
  final = {}
  for dtype in ("float32", "bfloat16"):
    ten_steps.dtype, ten_steps.parallel.allreduce_dtype = dtype, dtype
    _, params = _train(ten_steps, tmp_path / dtype)
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(params))  # Parameters stay float32.
    losses = [r["train/loss"] for r in metrics.read(str(tmp_path / dtype)) if "train/loss" in r]
    assert losses[-1] < 0.5 * losses[0]
    final[dtype] = losses[-1]
  # bfloat16 keeps 8 bits of mantissa: the curves agree to a few percent, not to float32 rounding.
  assert final["bfloat16"] == pytest.approx(final["float32"], rel=0.05)


@pytest.mark.parametrize("override, named", [
    ({"grad_accum_steps": 3}, "grad_accum_steps (3)"),       # 4 per device: 3 does not divide it.
    ({"dtype": "float8"}, "float8"),
    ({"parallel.allreduce_dtype": "int8"}, "int8"),
    ({"parallel.backend": "pmap", "parallel.shard_optimizer_state": True}, "'pmap'"),
    ({"max_grad_norm": -1.0}, "max_grad_norm must be a number >= 0"),
    ({"parallel.invariant": True, "parallel.num_devices": 2, "grad_accum_steps": 8}, "x grad_accum_steps (8)"),
    ({"parallel.invariant": True, "parallel.num_devices": 4, "eval_batch_size": 12}, "eval batch size (12)"),
    ({"parallel.invariant": True, "model.bn_axis_name": "data"}, "model.bn_axis_name='data'"),
    ({"parallel.invariant": True, "parallel.allreduce_dtype": "bfloat16"}, "allreduce_dtype='bfloat16'"),
    ({"parallel.invariant": True, "parallel.invariant_shards": 6}, "invariant_shards must be a power of two, got 6"),
    ({"parallel.invariant": True, "parallel.num_devices": 6, "batch_size": 48, "eval_batch_size": 48},
     "a power-of-two device count dividing invariant_shards (8), got 6 devices"),
    ({"parallel.num_devices": 9, "batch_size": 36, "eval_batch_size": 36},
     "parallel.num_devices (9) exceeds the 8 available devices"),
    ({"parallel.invariant": True, "parallel.shard_optimizer_state": True}, "cannot be combined"),
])
def test_bad_scaleup_settings_are_named(config, override, named):
  runs.override(config, override)
  with pytest.raises(config_lib.ConfigError, match=re.escape(named)):
    build.build(config)


def test_a_device_count_is_refused_on_several_processes(monkeypatch):
  """Each process of a multi-process run uses all its devices: a first-N subset would differ between processes."""
  monkeypatch.setattr(parallel.jax, "process_count", lambda: 2)
  with pytest.raises(config_lib.ConfigError, match=r"parallel.num_devices \(4\) is for single-process runs"):
    parallel.make_backend("mesh", 4)


def test_invariant_mode_is_bitwise_the_same_on_1_2_4_8_devices(ten_steps, tmp_path):
  ten_steps.parallel.invariant = True
  ten_steps.eval_batch_size = 40  # 3 batches of 40: the eval sums cross 5 to 40 rows per device.
  ten_steps.dataset.eval_split = "test[:120]"
  results, evals = {}, {}
  for n, accum in ((1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (8, 2)):
    ten_steps.parallel.num_devices, ten_steps.grad_accum_steps = n, accum
    result, results[(n, accum)] = _train(ten_steps, tmp_path / f"{n}_{accum}")
    evals[(n, accum)] = result.eval_metrics
  reference = results[(1, 1)]
  for (n, accum), params in results.items():
    for a, b in zip(jax.tree.leaves(results[(1, accum)]), jax.tree.leaves(params)):
      assert a.tobytes() == b.tobytes(), (n, accum)
    assert evals[(n, accum)] == evals[(1, accum)], (n, accum)  # Eval sums in one fixed order too.
  # Accumulation is honoured, not ignored: pieces of half the size round differently, so the result is
  # k = 1's to float precision but not to the bit.
  accumulated = results[(1, 2)]
  assert any(a.tobytes() != b.tobytes() for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(accumulated)))
  _close(accumulated, reference, rtol=1e-5, atol=1e-6)
  # The plain mode is not bitwise invariant (that is what the mode is for); it stays close.
  ten_steps.parallel.invariant, ten_steps.parallel.num_devices, ten_steps.grad_accum_steps = False, 8, 1
  _close(_train(ten_steps, tmp_path / "plain")[1], reference, rtol=1e-5, atol=1e-6)


def test_flops_per_step_count_every_micro_batch(ten_steps):
  # XLA counts the accumulation loop's body once; DataParallel.flops counts the whole optimizer step.
  ten_steps.batch_size = 256  # 32 per device: the forward and backward outweigh the update.
  plain = build.build(ten_steps)
  ten_steps.grad_accum_steps = 4
  accumulated = build.build(ten_steps)
  state = accumulated.backend.init(accumulated.init)
  batches = accumulated.dp.batches(accumulated.ds, batch_size=256, stop_step=1)
  whole = plain.dp.flops(state, batches)  # Compiled: no loop to count once.
  per_step = accumulated.dp.flops(state, batches)  # What the loop reports: the loop-free step's lowered count.
  assert per_step == pytest.approx(whole, rel=0.05)
  batch = next(batches)
  assert flops.step_flops(accumulated.train_step, state, batch) < 0.5 * per_step  # What XLA reports for the loop.

