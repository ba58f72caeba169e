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
