"""The learning-rate schedule; weight decay reaches matrices only (by default), also under
ZeRO-1's raveled optimizer state."""

import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from jaxdp import build, optim
from jaxdp.strategies import zero1_layout as zero
from jaxdp.config import ConfigError

LR, WD = 0.1, 0.5


class Normed(nnx.Module):
  """Linear (kernel, bias) -> LayerNorm (scale, bias) -> Linear: every kind of leaf the mask tells apart."""

  def __init__(self, input_shape: tuple, num_classes: int, *, rngs: nnx.Rngs):
    self.fc = nnx.Linear(int(np.prod(input_shape)), 16, rngs=rngs)
    self.norm = nnx.LayerNorm(16, rngs=rngs)
    self.head = nnx.Linear(16, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.head(nnx.relu(self.norm(self.fc(x.reshape(x.shape[0], -1)))))


def _params() -> dict:
  ones = lambda *shape: jnp.ones(shape, jnp.float32)  # noqa: E731
  return {"fc": {"kernel": ones(3, 4), "bias": ones(4)}, "norm": {"scale": ones(4), "bias": ones(4)},
          "embed": {"embedding": ones(5, 4)}}


def _decayed(params: dict) -> dict:
  """Which leaves one optimizer step with a zero gradient changed."""
  return jax.tree.map(lambda p: bool(np.any(np.asarray(p) != 1.0)), params)


def _zero_gradient_step(config, params: dict, shards: int = 0) -> dict:
  """One step with a zero gradient from all-ones parameters; `shards`: as ZeRO-1 lays them out (raveled)."""
  tx = optim.make(config, jax.eval_shape(lambda: params))
  seen = zero.flatten(params, shards) if shards else params
  updates, _ = tx.update(jax.tree.map(jnp.zeros_like, seen), tx.init(seen), seen)
  new = jax.tree.map(lambda p, u: p + u, seen, updates)
  return zero.unflatten(new, params) if shards else new


@pytest.mark.parametrize("shards", [0, 8], ids=["plain", "zero1"])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])  # Decoupled decay, and L2 (add_decayed_weights).
def test_only_matrices_decay(config, optimizer, shards):
  config.optimizer, config.learning_rate, config.weight_decay = optimizer, LR, WD
  new = _zero_gradient_step(config, _params(), shards)
  assert _decayed(new) == {"fc": {"kernel": True, "bias": False}, "norm": {"scale": False, "bias": False},
                           "embed": {"embedding": True}}
  np.testing.assert_allclose(new["fc"]["kernel"], 1.0 - LR * WD, rtol=1e-6)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_without_the_shapes_the_mask_is_computed_from_the_parameters_optax_sees(config, optimizer):
  config.optimizer, config.learning_rate, config.weight_decay = optimizer, LR, WD
  params = _params()
  tx = optim.make(config)  # Right for every layout but ZeRO-1's, whose optimizer sees raveled leaves.
  updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
  assert _decayed(jax.tree.map(jnp.add, params, updates)) == {
      "fc": {"kernel": True, "bias": False}, "norm": {"scale": False, "bias": False}, "embed": {"embedding": True}}


def test_mask_all_and_regex(config):
  config.optimizer, config.learning_rate, config.weight_decay = "adamw", LR, WD
  config.weight_decay_mask = "all"
  assert all(jax.tree.leaves(_decayed(_zero_gradient_step(config, _params(), 8))))
  config.weight_decay_mask = r"fc/kernel$"  # Paths are keys joined by "/".
  assert _decayed(_zero_gradient_step(config, _params(), 8))["embed"]["embedding"] is False
  assert sum(jax.tree.leaves(_decayed(_zero_gradient_step(config, _params())))) == 1


@pytest.mark.parametrize("spec, message", [
    ("rank>2", "weight_decay_mask 'rank>2' matches no parameter path (they look like embed/embedding, fc/bias"),
    ("kernel(", "weight_decay_mask 'kernel(' is neither rank>=2 nor all nor a regular expression"),
])
def test_bad_mask_is_a_config_error(config, spec, message):
  config.optimizer, config.weight_decay, config.weight_decay_mask = "adamw", WD, spec
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    optim.make(config, _params())


def test_build_masks_zero1_by_the_true_shapes(config):
  """build gives the optimizer the model's shapes: under ZeRO-1 it sees raveled leaves, yet biases and scales keep."""
  config.model = ml_collections.ConfigDict({"name": f"{__name__}:Normed"})
  config.optimizer, config.learning_rate, config.weight_decay = "adamw", LR, WD
  config.parallel.shard_optimizer_state = True
  parts = build.build(config)
  state = parts.init()
  assert all(x.ndim == 1 for x in jax.tree.leaves(state.opt_state) if x.ndim)  # The raveled layout.
  seen = zero.flatten(state.params, 8)
  updates, _ = parts.tx.update(jax.tree.map(jnp.zeros_like, seen), state.opt_state, seen)
  moved = jax.tree.map(lambda u: bool(np.any(u != 0)), updates)
  assert moved == {"fc": {"kernel": True, "bias": False}, "norm": {"scale": False, "bias": False},
                   "head": {"kernel": True, "bias": False}}


def test_nesterov_momentum_is_another_update_than_heavy_ball(config):
  config.optimizer, config.learning_rate = "sgd", LR
  params = {"w": jnp.ones(3)}
  grads = {"w": jnp.array([1.0, -2.0, 0.5])}

  def second_update(nesterov: bool) -> np.ndarray:
    config.optimizer_kwargs = ml_collections.ConfigDict({"momentum": 0.9, "nesterov": nesterov})
    tx = optim.make(config, params)
    state = tx.init(params)
    _, state = tx.update(grads, state, params)
    return np.asarray(tx.update(grads, state, params)[0]["w"])

  np.testing.assert_allclose(second_update(False), -LR * 1.9 * np.asarray(grads["w"]), rtol=1e-6)
  np.testing.assert_allclose(second_update(True), -LR * (0.9 * 1.9 + 1) * np.asarray(grads["w"]), rtol=1e-6)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_no_weight_decay_leaves_the_optimizer_state_unmasked(config, optimizer):
  """A run without weight decay keeps the state layout it always had: its checkpoints restore as before."""
  config.optimizer, config.learning_rate, config.weight_decay = optimizer, LR, 0.0
  params = _params()
  lr = optim.schedule(config)
  plain = optax.adamw(lr, weight_decay=0.0) if optimizer == "adamw" else optax.sgd(lr)
  assert jax.tree.structure(optim.make(config, params).init(params)) == jax.tree.structure(plain.init(params))


def _schedule(**fields) -> optax.Schedule:
  """The schedule of a config of these fields (a 0.1 peak, 10 warmup steps of 110, constant, unscaled)."""
  return optim.schedule(ml_collections.ConfigDict({
      "learning_rate": 0.1, "batch_size": 64, "warmup_steps": 10, "num_train_steps": 110,
      "lr_schedule": "constant", **fields}))


def test_the_peak_learning_rate_is_the_learning_rate_whatever_the_batch():
  assert float(_schedule(warmup_steps=0)(5)) == pytest.approx(0.1)
  assert float(_schedule(warmup_steps=0, batch_size=1024)(5)) == pytest.approx(0.1)  # No scaling rule.


def test_the_momentum_optimizer_is_one_error_naming_sgd_with_its_kwargs(config):
  config.optimizer = "momentum"
  with pytest.raises(ConfigError, match=re.escape('set optimizer="sgd" with optimizer_kwargs={"momentum": 0.9')):
    optim.make(config)


@pytest.mark.parametrize("kind", ["constant", "cosine"])
def test_warmup_rises_linearly_from_zero_to_the_peak(kind):
  lr = _schedule(lr_schedule=kind)
  np.testing.assert_allclose([float(lr(s)) for s in (0, 5, 10)], [0.0, 0.05, 0.1], rtol=1e-6, atol=1e-9)


def test_constant_stays_at_the_peak_and_cosine_decays_to_zero_at_the_last_step():
  constant, cosine = _schedule(), _schedule(lr_schedule="cosine")
  assert float(constant(60)) == float(constant(110)) == pytest.approx(0.1)
  np.testing.assert_allclose([float(cosine(s)) for s in (60, 110)], [0.05, 0.0], rtol=1e-6, atol=1e-9)


def test_a_warmup_as_long_as_the_run_still_reaches_the_peak():
  lr = _schedule(lr_schedule="cosine", warmup_steps=10, num_train_steps=10)
  assert float(lr(10)) == pytest.approx(0.1)
