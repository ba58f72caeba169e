"""The edges of `jaxdp.DataParallel` a plausible one-line bug would break: the DDP habit inside `@dp.step`, weights,
restores, `dp.replicate`, labels beyond the logits, per-example keys."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

import jaxdp
from jaxdp.tasks import Metric


def _regression(n: int = 32) -> tuple[dict, dict]:
  rng = np.random.default_rng(0)
  batch = {"x": rng.normal(size=(n, 4)).astype(np.float32), "y": rng.normal(size=(n, 2)).astype(np.float32)}
  return batch, {"w": rng.normal(size=(4, 2)).astype(np.float32)}


def _per_example(params: dict, batch: dict) -> jax.Array:
  return ((batch["x"] @ params["w"] - batch["y"]) ** 2).mean(-1)


@pytest.mark.parametrize("num_devices", [2, 8])
@pytest.mark.parametrize("habit", ["pmean", "value_and_grad"])
def test_one_sgd_step_in_dp_step_is_the_full_batch_gradient(num_devices, habit):
  batch, params = _regression()
  want = jax.grad(lambda p: _per_example(p, batch).mean())(params)
  dp = jaxdp.DataParallel(num_devices=num_devices)
  tx = optax.sgd(1.0)

  @dp.step
  def step(state: dict, batch: dict) -> tuple:
    if habit == "pmean":  # What every DDP user writes: this device's mean loss, its gradient, averaged.
      loss, grads = lax.pmean(jax.value_and_grad(lambda p: _per_example(p, batch).mean())(state["p"]), "data")
    else:
      loss, grads = dp.value_and_grad(_per_example)(state["p"], batch)
    updates, opt = tx.update(grads, state["opt"], state["p"])
    return {"p": optax.apply_updates(state["p"], updates), "opt": opt}, {"loss": loss}

  state, _ = step(dp.replicate({"p": params, "opt": tx.init(params)}), dp.backend.put_step(batch))
  np.testing.assert_allclose(params["w"] - np.asarray(state["p"]["w"]), np.asarray(want["w"]), rtol=1e-5)


def _weighted(model: object, batch: dict) -> tuple:
  """Cross-entropy weighted by the batch's "weight"."""
  loss = optax.softmax_cross_entropy_with_integer_labels(model(batch["inputs"]), batch["labels"])
  return Metric(loss, weights=batch["weight"]), {}


def _classes(weight: np.ndarray) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(1)
  n = len(weight)
  return {"inputs": rng.normal(size=(n, 4)).astype(np.float32), "labels": rng.integers(0, 3, n).astype(np.int32),
          "weight": weight.astype(np.float32)}


def _until_refused(step: object, state: object, batches: object) -> str:
  """The message of the ConfigError a loop over `batches` raises (a later call than the bad one may raise it)."""
  with pytest.raises(jaxdp.ConfigError) as e:
    for batch in batches:
      state = step(state, batch)[0]
    jax.block_until_ready(state)  # Every call computed: the next call reads what is left.
    step(state, batch)
  return str(e.value)


def test_negative_weights_are_refused_in_train_step_naming_the_metric_and_the_step():
  from flax import nnx
  weight = np.ones(64)
  weight[40] = -0.5  # Step 3's batch (rows 32..47 of a 16-row batch order 0..3 are step 3's; any one is refused).
  dp = jaxdp.DataParallel()
  state = dp.init(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), optax.sgd(0.1))
  for batch in dp.batches(_classes(np.ones(64)), batch_size=16, stop_step=2):  # Steps are named from the state's.
    state = dp.train_step(_weighted)(state, batch)[0]
  data = _classes(weight)
  ids = []
  message = _until_refused(dp.train_step(_weighted), state, dp.batches(data, batch_size=16, start_step=2,
                                                                       stop_step=8, on_ids=lambda i: ids.append(i)))
  step = next(i for i, rows in enumerate(ids, 3) if 40 in rows)
  assert message.startswith(f"metric 'loss' has 1 negative weights at step {step}:") and "in the loss" in message


@pytest.mark.parametrize("in_flight", [None, 0])
def test_negative_weights_are_refused_in_dp_step_naming_the_loss_and_the_call(in_flight, monkeypatch):
  """On CPU after at most the bounded steps in flight; unbounded (GPU, TPU) once the step is computed."""
  from jaxdp import wrap
  if in_flight is not None:
    monkeypatch.setattr(wrap, "steps_in_flight", lambda backend: in_flight)
  batch, params = _regression()
  dp = jaxdp.DataParallel()

  def signed(p: dict, batch: dict) -> Metric:
    return Metric(_per_example(p, batch), weights=batch["a"])

  @dp.step
  def step(state: dict, batch: dict) -> tuple:
    loss, grads = dp.value_and_grad(signed)(state, batch)
    return jax.tree.map(lambda p, g: p - g, state, grads), {"loss": loss}

  good, bad = {**batch, "a": np.ones(32, np.float32)}, {**batch, "a": np.linspace(-1, 1, 32).astype(np.float32)}
  put = dp.backend.put_step
  message = _until_refused(step, dp.replicate(params), [put(good), put(bad)] + [put(good)] * 16)
  assert message.startswith("metric 'signed' has 16 negative weights at call 2 of step:")


@pytest.mark.parametrize("total", [0.32, 0.0])
def test_value_and_grad_and_train_step_give_the_mean_gradient_of_fractional_weights(total):
  """Weights summing to less than 1 divide as any other; weights summing to 0 give no gradient and skip the step."""
  from flax import nnx
  weight = np.full(32, total / 32)
  data = _classes(weight)
  module = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
  graph, params = nnx.split(module)

  def loss_fn(p: object, batch: dict) -> Metric:
    return _weighted(lambda x: nnx.merge(graph, p)(x), batch)[0]

  def mean(p: object) -> jax.Array:
    m = loss_fn(p, data)
    return (m.values * m.weights).sum() / m.weights.sum()

  want = jax.grad(mean)(params) if total else jax.tree.map(jnp.zeros_like, params)
  dp = jaxdp.DataParallel()
  tx, decay = optax.sgd(1.0), optax.add_decayed_weights(0.5)  # Decay moves the parameters without a gradient.

  @dp.step
  def step(state: object, batch: dict) -> tuple:
    _, grads = dp.value_and_grad(loss_fn)(state, batch)
    return optax.apply_updates(state, decay.update(grads, decay.init(state), state)[0]), {"grads": grads}

  kept, metrics = step(dp.replicate(params), dp.backend.put_step(data))
  state = dp.init(module, tx)
  trained, trained_metrics = dp.train_step(_weighted)(state, dp.backend.put_step(data))
  stepped = [a - b for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(dp.backend.get(trained.params)))]
  for got in (jax.tree.leaves(metrics["grads"]), stepped):
    for g, w in zip(got, jax.tree.leaves(want), strict=True):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-7)
  assert int(metrics["zero_weight"]) == int(trained_metrics["zero_weight"]) == (total == 0)
  if not total:  # Skipped as train_step skips it: the state as it came in.
    for a, b in zip(jax.tree.leaves(dp.backend.get(kept)), jax.tree.leaves(params)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_normalize_gives_no_gradient_where_the_weight_is_not_positive():
  from jaxdp import step as step_lib
  grads = {"w": jnp.full((3,), 2.0)}
  for weight in (0.0, -4.0):
    np.testing.assert_array_equal(step_lib.normalize(grads, jnp.float32(weight))["w"], 0.0)
  np.testing.assert_allclose(step_lib.normalize(grads, jnp.float32(0.25))["w"], 8.0)


def test_replicate_copies_so_a_donating_step_leaves_the_callers_arrays_alive():
  dp = jaxdp.DataParallel()
  mine = {"w": jnp.arange(4.0), "n": np.ones(3, np.float32)}

  @dp.step
  def step(state: dict, batch: dict) -> tuple:
    return jax.tree.map(lambda x: x + 1, state), {"rows": batch["x"].sum()}

  state = step(dp.replicate(mine), dp.backend.put_step({"x": np.ones((8, 1), np.float32)}))[0]
  np.testing.assert_array_equal(np.asarray(mine["w"]), np.arange(4.0))  # Not deleted by the donation.
  np.testing.assert_array_equal(np.asarray(mine["n"]), 1.0)
  np.testing.assert_array_equal(dp.backend.get(state)["w"], np.arange(4.0) + 1)


def _linear(dp: jaxdp.DataParallel, seed: int = 0) -> object:
  from flax import nnx
  return dp.init(nnx.Linear(4, 3, rngs=nnx.Rngs(seed)), optax.sgd(0.1))


def test_every_batches_call_after_a_restore_is_held_to_the_checkpoints_stream(tmp_path):
  data = _classes(np.ones(64))
  dp = jaxdp.DataParallel()
  state, step = _linear(dp), dp.train_step(_weighted)
  for batch in dp.batches(data, batch_size=16, seed=0, stop_step=2):
    state = step(state, batch)[0]
  dp.save(str(tmp_path), state)
  again = jaxdp.DataParallel()
  _, start = again.restore(str(tmp_path), _linear(again, 1))
  again.batches(data, batch_size=16, seed=0, start_step=start).close()  # The checkpoint's own stream: taken.
  with pytest.raises(jaxdp.ConfigError, match="seed 0 -> 1"):  # A later call is held too, not only the first.
    again.batches(data, batch_size=16, seed=1, start_step=start)


def test_restore_step_n_restores_that_step_of_two(tmp_path):
  data = _classes(np.ones(64))
  dp = jaxdp.DataParallel()
  state, step = _linear(dp), dp.train_step(_weighted)
  saved = {}
  for batch in dp.batches(data, batch_size=16, stop_step=4):
    state = step(state, batch)[0]
    if int(dp.backend.get(state.step)) in (2, 4):
      saved[dp.save(str(tmp_path), state)] = dp.backend.get(state.params)
  again = jaxdp.DataParallel()
  for n in (2, 4):
    restored, at = again.restore(str(tmp_path), _linear(again, 1), step=n)
    assert at == n
    for a, b in zip(jax.tree.leaves(again.backend.get(restored.params)), jax.tree.leaves(saved[n]), strict=True):
      np.testing.assert_array_equal(a, b)


def test_evaluate_on_a_named_dataset_reads_its_eval_split(data_dir):
  from flax import nnx
  from jaxdp import data as datalib
  from jaxdp.configs import default
  from jaxdp.tasks import Classification
  config = default.get_config().dataset
  config.update(name="digits", data_dir=data_dir)
  ds = datalib.load(config)
  test, train = ds.num_examples(config.eval_split), ds.num_examples(config.train_split)
  assert test != train


  class Flat(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      self.out = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
      return self.out(x.reshape(x.shape[0], -1))

  dp = jaxdp.DataParallel(data_dir=data_dir)
  state = dp.init(Flat, optax.sgd(0.1))
  assert dp.evaluate(state, Classification(), "digits", batch_size=72)["eval/num_examples"] == test


def test_float16_at_loss_scale_1_counts_a_nonfinite_gradient_of_a_finite_loss_as_nonfinite():
  """At scale 1 halving cannot help: the step is a NaN step the guard counts, not an overflow forever."""
  import nan_models
  from flax import nnx
  from jaxdp.tasks import Classification
  rng = np.random.default_rng(0)
  data = {"inputs": rng.normal(size=(16, 64)).astype(np.float32), "labels": rng.integers(0, 10, 16).astype(np.int32)}
  dp = jaxdp.DataParallel(dtype="float16")
  state = dp.init(nan_models.OneNaNGradient(rngs=nnx.Rngs(0)), optax.sgd(0.1))
  step = dp.train_step(Classification())
  for scale, nonfinite, overflow in ((1.0, 1, 0), (2.0, 0, 1)):
    state = state.replace(loss_scale=state.loss_scale.replace(scale=dp.replicate(np.float32(scale))))
    state, metrics = step(state, dp.backend.put_step(data))
    assert (int(metrics["nonfinite"]), int(metrics["overflow"])) == (nonfinite, overflow), scale
    assert np.isfinite(float(metrics["loss"]))


@pytest.mark.parametrize("num_devices", [1, 8])
def test_invariant_accumulation_gives_model_state_the_mean_over_its_micro_batches(num_devices):
  """BatchNorm-like statistics of k micro-batches per shard: the mean of every piece's, not k times it."""
  import types
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P
  from jaxdp import strategies
  options = strategies.StrategyOptions(accum_steps=2, num_shards=num_devices, invariant_shards=8)
  invariant = strategies.Invariant(options)
  x = np.arange(64, dtype=np.float32)

  def grad_fn(params: jax.Array, model_state: dict, micro: dict, rng: jax.Array) -> tuple:
    loss = (params * micro["x"]).sum()
    sums = {"mean": {"loss": loss}, "weight": {"loss": jnp.float32(micro["x"].size)}, "sum": {}, "max": {}}
    running = {"mean": 0.9 * model_state["mean"] + 0.1 * micro["x"].mean()}  # A BatchNorm running mean's update.
    return (loss, (sums, running)), micro["x"].sum()

  def step(batch: dict) -> jax.Array:
    holder = types.SimpleNamespace(params=jnp.float32(1), model_state={"mean": jnp.float32(5)})
    axis = strategies.DataAxis("data")
    return invariant.gradients(grad_fn, holder, batch, jax.random.PRNGKey(0), axis)[1]["mean"]

  mesh = Mesh(np.array(jax.devices()[:num_devices]), ("data",))
  got = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=P("data"), out_specs=P(), check_vma=False))({"x": x})
  np.testing.assert_allclose(float(got), 0.9 * 5 + 0.1 * x.mean(), rtol=1e-6)


def test_labels_past_the_models_outputs_are_one_error_naming_both_numbers(tmp_path):
  from flax import nnx
  from jaxdp.configs import default
  from jaxdp.tasks import Classification
  data = _classes(np.ones(64))  # Labels 0, 1, 2.
  dp = jaxdp.DataParallel()
  state = dp.init(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), optax.sgd(0.1))
  step = dp.train_step(Classification())
  message = "the model gives 2 outputs per example, but the labels of .* run to 2 \\(3 classes\\)"
  with pytest.raises(jaxdp.ConfigError, match=message):
    step(state, next(dp.batches(data, batch_size=16)))

  class Five(nnx.Module):  # 5 outputs for 10 classes, through train_and_evaluate.
    def __init__(self, rngs: nnx.Rngs):
      self.out = nnx.Linear(4, 5, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
      return self.out(x)

  rng = np.random.default_rng(0)
  ten = {"inputs": rng.normal(size=(64, 4)).astype(np.float32), "labels": np.arange(64, dtype=np.int32) % 10}
  config = default.get_config()
  config.update(batch_size=16, num_train_steps=2, checkpoint_every_steps=0)
  with pytest.raises(jaxdp.ConfigError, match=r"the model gives 5 outputs per example, .* \(10 classes\)"):
    jaxdp.train_and_evaluate(config, str(tmp_path), model=Five, train_data=ten, eval_data=ten)


@pytest.mark.parametrize("accum", [1, 2])
def test_example_keys_draw_the_same_noise_on_1_and_8_devices(accum):
  batch, params = _regression()

  def noisy(p: dict, batch: dict) -> jax.Array:  # A GAN's noise, dropout: one draw per example from its own key.
    noise = jax.vmap(lambda k: jax.random.normal(k, (2,)))(batch["key"])
    return ((batch["x"] @ p["w"] + noise - batch["y"]) ** 2).mean(-1)

  grads = {}
  for n in (1, 8):
    dp = jaxdp.DataParallel(num_devices=n, grad_accum_steps=accum)

    @dp.step
    def step(state: dict, batch: dict) -> tuple:
      key = jax.random.fold_in(state["key"], state["step"])  # This step's key, then one per example.
      _, g = dp.value_and_grad(noisy)(state["p"], {**batch, "key": dp.example_keys(key, batch)})
      return {**state, "step": state["step"] + 1}, {"grads": g}

    state = dp.replicate({"p": params, "key": jax.random.PRNGKey(7), "step": np.int32(3)})
    grads[n] = np.asarray(step(state, dp.backend.put_step(batch))[1]["grads"]["w"])
  np.testing.assert_allclose(grads[8], grads[1], rtol=1e-5)


def test_a_schedule_as_the_configs_learning_rate_is_one_error_naming_optimizer():
  import ml_collections
  from jaxdp import config as config_lib
  config = ml_collections.ConfigDict()
  config.learning_rate = optax.cosine_decay_schedule(0.1, 100)
  with pytest.raises(jaxdp.ConfigError, match=r"^learning_rate is a number .* optimizer=optax.adamw\(schedule\)"):
    config_lib.validate(config_lib.with_defaults(config), 8, 1)
