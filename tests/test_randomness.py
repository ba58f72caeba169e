"""Randomness of the forward pass is keyed by the data each device sees: per device, per micro-batch."""

import itertools

import jax
import ml_collections
import numpy as np
import pytest
import runs
from flax import nnx

from jaxdp import build, data, train
from jaxdp.models.adapter import from_nnx
from jaxdp.report import metrics


def _model(config, name, **kwargs):
  config.model = ml_collections.ConfigDict({"name": f"dropout_models:{name}", **kwargs})
  return config


def _masks(config, steps: int = 1) -> list:
  """Every device's dropout mask after each of the first `steps` train steps, each [devices, MASK_WIDTH]."""
  parts = build.build(config)
  state = parts.backend.init(parts.init)
  masks = []
  for batch in itertools.islice(data.train_batches(parts.ds, "train", seed=0, global_batch=config.batch_size,
                                                   start_step=0, process_index=0, process_count=1), steps):
    state, _ = parts.train_step(state, parts.backend.put_step(batch))
    masks.append(jax.tree.leaves(parts.backend.replicas(state.model_state))[0])
  return masks


@pytest.mark.parametrize("name", ["MaskNNX", "MaskLinen"])
def test_each_device_draws_its_own_dropout_mask(config, name):
  # pmap: the per-device masks (int model state, never averaged) come back as they are.
  config.parallel.backend, config.batch_size = "pmap", 8  # One example per device.
  masks = _masks(_model(config, name))[0]
  assert masks.shape == (8, 32) and 0 < masks.mean() < 1
  assert len({m.tobytes() for m in masks}) == 8, masks  # With one key for all, every row would be the same.


def test_micro_batches_draw_their_own_masks(config):
  # With accumulation the device's last micro-batch is not keyed like the first: masks differ from k=1's.
  config.parallel.backend, config.batch_size = "pmap", 16
  one = _masks(_model(config, "MaskNNX"))[0]
  config.grad_accum_steps = 2
  two = _masks(_model(config, "MaskNNX"))[0]
  assert not np.array_equal(one, two)
  assert len({m.tobytes() for m in two}) == 8


def test_micro_batch_i_of_device_d_draws_the_key_of_its_place_in_the_global_batch(config):
  # fold_in(rng, d * k + i): 4 devices x 2 micro-batches key their examples as 8 devices x 1 do.
  config.parallel.backend, config.batch_size = "pmap", 8
  eight = _masks(_model(config, "MaskNNX"))[0]
  config.parallel.num_devices, config.grad_accum_steps = 4, 2
  four_by_two = _masks(_model(config, "MaskNNX"))[0]
  np.testing.assert_array_equal(four_by_two, eight[1::2])  # The mask kept is the last micro-batch's: 2d + 1.


@pytest.mark.parametrize("name", ["DropoutMLP", "DropoutMLPLinen"])
def test_dropout_models_train(config, tmp_path, name):
  config.num_train_steps, config.log_every_steps, config.learning_rate = 40, 10, 1e-2
  train.train_and_evaluate(_model(config, name), str(tmp_path))
  losses = runs.train_losses(tmp_path)
  assert losses[40] < 0.6 * losses[10], losses
  assert [r for r in metrics.read(str(tmp_path)) if "eval/accuracy" in r][-1]["eval/accuracy"] > 0.5


def _train_steps(config, steps):
  """`steps` train steps through build's parts only (no eval, no summary): the parameters on the host."""
  parts = build.build(config)
  state = parts.backend.init(parts.init)
  for batch in itertools.islice(data.train_batches(parts.ds, "train", seed=0, global_batch=config.batch_size,
                                                   start_step=0, process_index=0, process_count=1), steps):
    state, _ = parts.train_step(state, parts.backend.put_step(batch))
  return parts.backend.get(state.params)


def test_invariant_mode_is_bitwise_the_same_with_dropout(config):
  config.parallel.invariant, config.batch_size = True, 32
  _model(config, "DropoutMLP", rate=0.5)
  results = {}
  for n, accum in ((1, 1), (2, 1), (4, 1), (4, 2)):
    config.parallel.num_devices, config.grad_accum_steps = n, accum
    results[(n, accum)] = _train_steps(config, 6)
  for n in (2, 4):
    runs.assert_bitwise(results[(n, 1)], results[(1, 1)])
  # Accumulation is honoured: each piece draws its own mask, so the result is not k=1's (the bitwise
  # invariance of k=2 across device counts is test_scaleup's).
  assert not np.array_equal(jax.tree.leaves(results[(4, 2)])[0], jax.tree.leaves(results[(1, 1)])[0])


def test_each_step_draws_new_masks(config):
  config.parallel.backend, config.batch_size = "pmap", 8
  # The step's key folds in its number: one key for all would repeat the masks.
  assert not np.array_equal(*_masks(_model(config, "MaskNNX"), steps=2))


class _TwoStreams(nnx.Module):
  """Two dropouts of the same input, one drawing from the "dropout" stream, one from a stream of its own."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.a = nnx.Dropout(0.5, rng_collection="dropout", rngs=rngs)
    self.b = nnx.Dropout(0.5, rng_collection="noise", rngs=nnx.Rngs(noise=0))

  def __call__(self, x):
    return self.a(x), self.b(x)


def test_an_nnx_modules_streams_draw_apart_from_the_one_key_and_eval_draws_nothing():
  model = from_nnx(_TwoStreams, {})
  params, state = model.init(jax.random.PRNGKey(0))
  x = jax.numpy.ones((4, 64))
  (a, b), _ = model.apply(params, state, x, train=True, rng=jax.random.PRNGKey(3))
  (again, _), _ = model.apply(params, state, x, train=True, rng=jax.random.PRNGKey(3))
  (other, _), _ = model.apply(params, state, x, train=True, rng=jax.random.PRNGKey(4))
  assert 0.3 < float((a == 0).mean()) < 0.7 and 0.3 < float((b == 0).mean()) < 0.7
  assert not np.array_equal(a == 0, b == 0)  # Each stream its own key: never the same mask.
  np.testing.assert_array_equal(a, again)
  assert not np.array_equal(a, other)
  (a, b), _ = model.apply(params, state, x, train=False, rng=jax.random.PRNGKey(3))
  np.testing.assert_array_equal(a, x)  # Eval: no dropout, whatever the key.
  np.testing.assert_array_equal(b, x)
