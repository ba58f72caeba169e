"""The gradient strategies: clipping of the reduced gradient, and the NaN decision taken by all devices."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxdp import build, data, parallel, strategies
from jaxdp import config as config_lib
from jaxdp import step as step_lib
from jaxdp.strategies import zero1_layout
from jaxdp.tasks.classification import cross_entropy


def _first_batch(parts, config):
  return next(data.train_batches(parts.ds, "train", seed=0, global_batch=config.batch_size, start_step=0,
                                 process_index=0, process_count=1))


def _full_batch_grads(parts, params, model_state, batch):
  """The gradient of the whole global batch on one device, with no parallelism at all."""

  def loss(p):
    logits, _ = parts.model.apply(p, model_state, jnp.asarray(batch["inputs"]), train=True)
    return cross_entropy(logits, batch["labels"]).mean()

  return jax.grad(loss)(params)


@pytest.mark.parametrize("flag", [None, "shard_optimizer_state", "shard_params"])
def test_clipping_matches_optax_on_the_full_batch_gradient(config, flag):
  config.optimizer, config.learning_rate, config.max_grad_norm = "sgd", 1.0, 0.05
  if flag:
    config.parallel[flag] = True
  parts = build.build(config)
  state = parts.backend.init(parts.init)
  params0, model_state = parts.backend.get((state.params, state.model_state))
  batch = _first_batch(parts, config)
  grads = _full_batch_grads(parts, params0, model_state, batch)
  assert optax.tree.norm(grads) > 4 * config.max_grad_norm  # Clipping is active.
  expected, _ = optax.clip_by_global_norm(config.max_grad_norm).update(grads, optax.EmptyState())
  state, _ = parts.train_step(state, parts.backend.put_step(batch))
  # SGD with learning rate 1: params0 - params1 is the clipped gradient.
  got = jax.tree.map(lambda a, b: a - b, params0, parts.backend.get(state.params))
  # atol: params0 - params1 loses the last bits of parameters of size ~0.5 (a float32 ulp there is 6e-8).
  jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, rtol=1e-5, atol=2e-7), got, expected)


def test_zero1_devices_agree_when_one_slice_is_nonfinite():
  # Device 1 alone holds the NaN of the reduce-scattered gradient; every device must answer False.
  backend = parallel.make_backend("mesh", 8, strategies.ZeRO1)
  strategy = strategies.ZeRO1(strategies.StrategyOptions(num_shards=8))
  flat = np.zeros(64, np.float32)
  flat[13] = np.nan  # Slice 1 of 8.
  grads = {"w": jax.device_put(flat, NamedSharding(backend.mesh, P("data")))}
  decide = jax.jit(jax.shard_map(lambda g: strategy.finite(jnp.float32(1), g, backend.axis)[None],
                                 mesh=backend.mesh, in_specs=P("data"), out_specs=P("data"), check_vma=False))
  assert np.asarray(decide(grads)).tolist() == [False] * 8


@pytest.mark.parametrize("flag", [None, "shard_optimizer_state", "shard_params"])
def test_a_nonfinite_gradient_element_on_one_device_skips_the_step_everywhere(config, flag):
  config.model = ml_collections.ConfigDict({"name": "nan_models:OneNaNGradient"})  # Probe slice 1 of 8.
  if flag:
    config.parallel[flag] = True
  parts = build.build(config)
  state = parts.backend.init(parts.init)
  before = parts.backend.replicas(state.params)
  state, metrics = parts.train_step(state, parts.backend.put_step(_first_batch(parts, config)))
  assert int(parts.backend.get(metrics)["nonfinite"]) == 1
  after = parts.backend.replicas(state.params)
  jax.tree.map(np.testing.assert_array_equal, before, after)  # No replica moved, not even partly.
  assert int(parts.backend.get(state.step)) == 1


@pytest.mark.parametrize("flag, expected", [(None, strategies.DataParallel), ("invariant", strategies.Invariant),
                                            ("shard_optimizer_state", strategies.ZeRO1)])
def test_each_parallel_flag_picks_its_strategy(config, flag, expected):
  """`strategies.REGISTRY` is the one list of strategies; the config's flag picks one, none picks plain DDP."""
  if flag is not None:
    config.parallel[flag] = True
  assert strategies.select(config) is expected


def _three_steps(config, **parallel):
  """(model_state, params) after 3 steps of `counter_models:CountingNNX` (an int32 call counter, a float mean)."""
  config.model = ml_collections.ConfigDict({"name": "counter_models:CountingNNX"})
  config.grad_accum_steps = parallel.pop("accum", 1)
  config.parallel.update(parallel)
  parts = build.build(config)
  state = parts.backend.init(parts.init)
  batches = data.train_batches(parts.ds, "train", seed=0, global_batch=config.batch_size, start_step=0,
                               process_index=0, process_count=1)
  for _ in range(3):
    state, _ = parts.train_step(state, parts.backend.put_step(next(batches)))
  return parts.backend.get((state.model_state, state.params))


@pytest.mark.parametrize("parallel", [{"num_devices": 8}, {"num_devices": 8, "accum": 2},
                                      {"num_devices": 8, "shard_optimizer_state": True, "accum": 2},
                                      {"num_devices": 8, "shard_params": True, "accum": 2},
                                      {"invariant": True, "num_devices": 1}, {"invariant": True, "num_devices": 8},
                                      {"invariant": True, "num_devices": 8, "accum": 2}],
                         ids=["ddp", "ddp-accum2", "zero1-accum2", "fsdp-accum2", "invariant-1", "invariant-8", "invariant-8-accum2"])
def test_an_integer_model_state_counts_calls_as_plain_ddp_does(config, parallel):
  """A counter is state, not a statistic: +1 per micro-batch a replica runs, never summed over replicas or shards."""
  accum = parallel.get("accum", 1)
  model_state, _ = _three_steps(config, **parallel)
  assert model_state["calls"].dtype == np.int32
  assert int(model_state["calls"]) == 3 * accum


def test_invariant_float_model_state_is_the_same_bits_on_one_and_eight_devices(config):
  one = _three_steps(config.copy_and_resolve_references(), invariant=True, num_devices=1)
  eight = _three_steps(config, invariant=True, num_devices=8)
  assert float(one[0]["mean"]) != 0.0  # The statistic moved.
  jax.tree.map(np.testing.assert_array_equal, one, eight)


def _wanted(strategy: strategies.Strategy, tx: optax.GradientTransformation, params: dict) -> step_lib.TrainState:
  """The abstract train state `strategy` lays out for `params`."""
  return jax.eval_shape(lambda: step_lib.TrainState(step=jnp.int32(0), params=params, model_state={},
                                                    opt_state=strategy.init_opt_state(tx, params),
                                                    rng=jax.random.PRNGKey(0)))


def _as_stored(strategy: strategies.Strategy, wanted: step_lib.TrainState, stored: tuple) -> tuple:
  """The optimizer state's layout the strategy asks the checkpoint for, `stored` being what it holds."""
  by_path = {path: x for path, x in jax.tree_util.tree_flatten_with_path(stored)[0]}
  return strategy.stored_opt_layout(wanted, lambda path: by_path.get(path))


@pytest.mark.parametrize("to", [0, 4], ids=["plain", "zero1-4"])
def test_a_strategy_reads_an_8_device_zero1_optimizer_state_into_its_own_layout(to):
  """The checkpoint asks the strategy: stored ZeRO-1 leaves (8 devices) come back in the parameters' shapes or
  padded for 4 devices, with their values; the integer count as it was."""
  params = {"w": jnp.arange(15.0).reshape(3, 5), "b": jnp.arange(3.0) - 1}
  tx = optax.adam(0.1)
  stored = (optax.ScaleByAdamState(count=jnp.int32(3), mu=zero1_layout.flatten(params, 8),
                                   nu=zero1_layout.flatten(jax.tree.map(jnp.square, params), 8)), optax.EmptyState())
  strategy = strategies.ZeRO1(strategies.StrategyOptions(num_shards=to)) if to else strategies.DataParallel()
  wanted = _wanted(strategy, tx, params)
  as_stored = _as_stored(strategy, wanted, stored)
  assert jax.tree.map(lambda x: x.shape, as_stored) == jax.tree.map(lambda x: x.shape, stored)
  one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  got = strategy.relayout_opt_state(stored, wanted, jax.tree.map(lambda _: one_device, wanted.opt_state))
  assert jax.tree.map(lambda x: x.shape, got) == jax.tree.map(lambda x: x.shape, wanted.opt_state)
  adam = got[0]
  mu, nu = (zero1_layout.unflatten(adam.mu, params), zero1_layout.unflatten(adam.nu, params)) if to else (adam.mu,
                                                                                                         adam.nu)
  jax.tree.map(np.testing.assert_array_equal, (mu, nu, adam.count), (params, jax.tree.map(jnp.square, params), 3))
  if to:  # ZeRO-1's padding is zeros, as its own init lays it.
    jax.tree.map(lambda f, p: np.testing.assert_array_equal(np.asarray(f)[p.size:], 0), adam.mu, params)


def test_a_stored_leaf_of_another_dtype_keeps_the_wanted_layout_so_that_the_restore_names_it():
  """A ZeRO-1 leaf stored in bfloat16 holds no float32 values to re-lay: asked for as it is wanted, its shape and
  dtype are refused by the checkpoint's check, by name, instead of being cast on the way."""
  params = {"w": jnp.zeros((3, 5)), "b": jnp.zeros(3)}
  tx = optax.adam(0.1)
  in_bf16 = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
  stored = (optax.ScaleByAdamState(count=jnp.int32(3), mu=zero1_layout.flatten(in_bf16, 8),
                                   nu=zero1_layout.flatten(params, 8)), optax.EmptyState())
  strategy = strategies.DataParallel()
  adam = _as_stored(strategy, _wanted(strategy, tx, params), stored)[0]
  assert jax.tree.map(lambda x: x.shape, (adam.mu, adam.nu)) == ({"b": (3,), "w": (3, 5)}, {"b": (8,), "w": (16,)})


def test_a_replicated_strategy_of_its_own_reads_a_zero1_optimizer_state_as_stored():
  """The base strategy's layout is a replicated state's: nothing is re-laid, so the checkpoint's check names the leaf."""
  params = {"w": jnp.zeros((3, 5)), "b": jnp.zeros(3)}
  stored = (optax.ScaleByAdamState(count=jnp.int32(3), mu=zero1_layout.flatten(params, 8),
                                   nu=zero1_layout.flatten(params, 8)), optax.EmptyState())
  strategy = strategies.Invariant(strategies.StrategyOptions(num_shards=1))
  wanted = _wanted(strategy, optax.adam(0.1), params)
  assert _as_stored(strategy, wanted, stored) is wanted.opt_state


@pytest.mark.parametrize("flag", [None, "shard_optimizer_state", "shard_params"])
def test_accumulated_micro_batches_report_the_metrics_of_the_whole_batch(config, flag):
  """The first step's loss and accuracy (before any update) are the batch's, however many micro-batches ran."""
  if flag:
    config.parallel[flag] = True
  reported = []
  for accum in (1, 2, 4):
    config.grad_accum_steps = accum
    parts = build.build(config)
    state = parts.backend.init(parts.init)
    _, metrics = parts.train_step(state, parts.backend.put_step(_first_batch(parts, config)))
    reported.append(parts.backend.get(metrics))
  for got in reported[1:]:
    assert got["loss"] == pytest.approx(reported[0]["loss"], rel=1e-5)
    assert got["accuracy"] == pytest.approx(reported[0]["accuracy"], rel=1e-6)


def test_every_option_comes_from_its_config_field():
  config = config_lib.with_defaults(ml_collections.ConfigDict({
      "grad_accum_steps": 2, "dtype": "bfloat16", "max_grad_norm": 1,
      "parallel": {"allreduce_dtype": "float16", "invariant_shards": 4}}))
  assert strategies.StrategyOptions.from_config(config, num_devices=4) == strategies.StrategyOptions(
      accum_steps=2, compute_dtype="bfloat16", allreduce_dtype="float16", num_shards=4, invariant_shards=4,
      max_grad_norm=1.0)
