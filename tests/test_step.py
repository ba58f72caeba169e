"""The per-replica step: gradients are averaged exactly once, whatever the device count or backend."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdp import build, data, models, optim, parallel, strategies, tasks
from jaxdp.batch import REAL
from jaxdp import step as step_lib
from jaxdp.tasks.classification import cross_entropy


def _setup(config, optimizer):
  config.optimizer, config.learning_rate = optimizer, 1.0
  ds = data.load(config.dataset)
  model = models.get_model(config.model, ds.input_shape, ds.num_classes)
  tx = optim.make(config)
  batch = next(data.train_batches(ds, "train", seed=0, global_batch=config.batch_size, start_step=0,
                                  process_index=0, process_count=1))
  init = functools.partial(step_lib.init_state, jax.random.PRNGKey(0), model=model, tx=tx)
  return model, tx, batch, init


def _one_step(backend_name, num_devices, model, tx, batch, init):
  backend = parallel.make_backend(backend_name, num_devices)
  state = backend.init(init)
  train = backend.map_train(functools.partial(step_lib.train_step, model=model, tx=tx))
  state, _ = train(state, backend.put_step(batch))
  return backend.get(state)


def _reference_grads(model, batch, init):
  """The full-batch gradient on one device, with no parallelism at all."""
  state = init()

  def loss(params):
    logits, _ = model.apply(params, state.model_state, batch["inputs"], train=True)
    return cross_entropy(logits, batch["labels"]).mean()

  return state.params, jax.grad(loss)(state.params)


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
@pytest.mark.parametrize("num_devices", [1, 8])
def test_sgd_step_applies_the_full_batch_gradient(config, backend, num_devices):
  model, tx, batch, init = _setup(config, "sgd")
  params0, grads = _reference_grads(model, batch, init)
  params1 = _one_step(backend, num_devices, model, tx, batch, init).params
  # SGD with learning rate 1: params1 = params0 - grad. An extra psum would give 8x the gradient.
  got = jax.tree.map(lambda a, b: a - b, params0, params1)
  jax.tree.map(lambda g, r: np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6), got, grads)


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_adam_moments_match_one_device(config, backend):
  # Adam's first update is ~lr*sign(g) and hides a wrong gradient scale; its moments do not.
  model, tx, batch, init = _setup(config, "adam")
  one = _one_step(backend, 1, model, tx, batch, init).opt_state
  eight = _one_step(backend, 8, model, tx, batch, init).opt_state
  mu1, mu8 = one[0].mu, eight[0].mu
  nu1, nu8 = one[0].nu, eight[0].nu
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), mu1, mu8)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-10), nu1, nu8)
  assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(mu8)) > 1e-4  # Non-trivial gradients.


def test_naive_pmean_under_shard_map_would_be_caught(config):
  """Without marking parameters varying, shard_map's grad already sums: the guard the step relies on."""
  model, tx, batch, init = _setup(config, "sgd")
  _, grads = _reference_grads(model, batch, init)
  backend = parallel.make_backend("mesh", 8)
  naive = parallel.MeshBackend(backend.devices)
  naive.axis = step_lib.DataAxis("data", mark_varying=False)
  train = naive.map_train(functools.partial(step_lib.train_step, model=model, tx=tx))
  state = naive.init(init)
  params0 = naive.get(state.params)
  state, _ = train(state, naive.put_step(batch))
  got = jax.tree.map(lambda a, b: a - b, params0, naive.get(state.params))
  ratio = np.asarray(jax.tree.leaves(got)[0]) / np.asarray(jax.tree.leaves(grads)[0])
  np.testing.assert_allclose(np.nanmedian(ratio), 8.0, rtol=1e-3)  # The trap the tests must catch.


def test_running_statistics_are_averaged_over_replicas(config):
  """BatchNorm without a cross-replica axis normalizes per slice; its running averages are the replicas' mean."""
  config.model, config.parallel.backend = ml_collections.ConfigDict({"name": "user_models:LinenBNNet"}), "pmap"
  parts = build.build(config)
  state = parts.backend.init(parts.init)
  params, model_state = parts.backend.get((state.params, state.model_state))
  batch = next(data.train_batches(parts.ds, "train", seed=0, global_batch=config.batch_size, start_step=0,
                                  process_index=0, process_count=1))
  per_replica = [parts.model.apply(params, model_state, jnp.asarray(x), train=True)[1]
                 for x in np.split(batch["inputs"], 8)]  # Each replica's slice alone.
  expected = jax.tree.map(lambda *xs: np.mean(xs, axis=0), *per_replica)
  state, _ = parts.train_step(state, parts.backend.put_step(batch))
  replicas = parts.backend.replicas(state.model_state)
  jax.tree.map(lambda r, e: np.testing.assert_allclose(r, np.broadcast_to(e, r.shape), rtol=1e-5, atol=1e-7),
               replicas, expected)


def test_label_smoothing_trains_against_smoothed_targets(config):
  # SGD, lr 1, 8 devices: the update is the full-batch gradient of the smoothed loss, computed here by hand.
  model, tx, batch, init = _setup(config, "sgd")
  state, s = init(), 0.2
  task = tasks.Classification(label_smoothing=s)

  def loss(params):
    logits, _ = model.apply(params, state.model_state, batch["inputs"], train=True)
    logp = jax.nn.log_softmax(logits)
    hard = -jnp.take_along_axis(logp, batch["labels"][:, None], -1)[:, 0]
    return ((1 - s) * hard - s * logp.mean(-1)).mean()

  grads = jax.grad(loss)(state.params)
  backend = parallel.make_backend("mesh", 8)
  train = backend.map_train(functools.partial(step_lib.train_step, model=model, tx=tx, task=task))
  params1 = backend.get(train(backend.init(init), backend.put_step(batch))[0]).params
  got = jax.tree.map(lambda a, b: a - b, state.params, params1)
  jax.tree.map(lambda g, r: np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6), got, grads)


def test_the_model_sees_its_parameters_in_the_compute_dtype_in_train_and_eval(config):
  """bfloat16 compute casts the parameters too: bfloat16 inputs alone would promote every matmul back to float32."""
  model, tx, batch, init = _setup(config, "sgd")
  seen = []

  def apply(params, *args, **kwargs):
    seen.append({x.dtype.name for x in jax.tree.leaves(params)})
    return model.apply(params, *args, **kwargs)

  spy = models.Model(model.init, apply)
  strategy = strategies.DataParallel(strategies.StrategyOptions(compute_dtype="bfloat16"))
  backend = parallel.make_backend("mesh", 2)
  state = backend.init(init)
  backend.map_eval(functools.partial(step_lib.eval_step, model=spy, strategy=strategy))(
      state, backend.put_batch({**batch, REAL: np.ones(len(batch["labels"]), bool)}))
  backend.map_train(functools.partial(step_lib.train_step, model=spy, tx=tx, strategy=strategy))(
      state, backend.put_step(batch))
  assert seen == [{"bfloat16"}, {"bfloat16"}], seen
