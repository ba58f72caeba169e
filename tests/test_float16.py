"""float16 compute trains under dynamic loss scaling: gradients that underflow unscaled survive, an overflowing
step is skipped and halves the scale, the scale is logged and resumes bitwise after SIGKILL."""

import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import runs
import weighted_tasks
from jaxdp import build, checkpoint, loss_scale, step as step_lib
from jaxdp.report import metrics

TESTS = os.path.dirname(os.path.abspath(__file__))
TINY = 1e-8  # A loss factor at which float16's unscaled gradients underflow.
OVERFLOWING = 0.01  # One at which the gradients scaled by loss_scale.INITIAL_SCALE overflow float16.


def test_float16_gradients_underflow_unscaled_and_survive_scaled():
  config = weighted_tasks.config()
  data = weighted_tasks.arrays()
  parts = build.build(config, model=weighted_tasks.MLP, task=weighted_tasks.scaled, train_data=data, eval_data=data)
  state = parts.backend.get(parts.backend.init(parts.init))
  batch = {k: jnp.asarray(v[:64]) for k, v in data.items()}
  task = lambda m, b: weighted_tasks.scaled(m, b, factor=TINY)  # noqa: E731

  def grads(dtype, scale):
    fn = step_lib._grad_fn(parts.model, task, dtype, True, None if scale is None else jnp.float32(scale))
    return np.concatenate([np.ravel(g) for g in jax.tree.leaves(fn(state.params, state.model_state, batch,
                                                                   jax.random.PRNGKey(0))[1])])

  exact = grads("float32", None)
  assert np.count_nonzero(exact) > 0.7 * exact.size  # The rest: pixels that are 0 in every digit, dead units.
  unscaled = grads("float16", None)  # Most underflow to 0; the rest are subnormals of a bit or two.
  assert np.count_nonzero(unscaled) < 0.5 * np.count_nonzero(exact)
  assert np.linalg.norm(unscaled - exact) > 0.3 * np.linalg.norm(exact)
  scaled = grads("float16", loss_scale.INITIAL_SCALE) / loss_scale.INITIAL_SCALE
  assert np.count_nonzero(scaled) >= 0.95 * np.count_nonzero(exact)
  assert np.linalg.norm(scaled - exact) < 1e-2 * np.linalg.norm(exact)


def test_float16_trains_to_float32s_eval_loss(tmp_path):
  config = runs.override(weighted_tasks.config(steps=60), {"task.factor": TINY, "learning_rate": 0.2 / TINY})
  data = weighted_tasks.arrays()
  losses = {}
  for dtype in ("float32", "float16"):
    config.dtype = dtype
    result = weighted_tasks.train(config, str(tmp_path / dtype), data, task=weighted_tasks.scaled)
    losses[dtype] = result.eval_metrics["eval/loss"]
  untrained = float(np.log(10)) * TINY
  assert losses["float32"] < 0.5 * untrained, losses
  assert losses["float16"] == pytest.approx(losses["float32"], rel=0.02)
  logged = [r for r in metrics.read(str(tmp_path / "float16")) if "train/loss_scale" in r]
  assert logged and all(r["train/loss_scale"] == loss_scale.INITIAL_SCALE for r in logged)  # Nothing overflowed.
  assert not any("train/loss_scale" in r for r in metrics.read(str(tmp_path / "float32")))  # No scale outside float16.


def test_an_overflowing_step_is_skipped_and_halves_the_scale(tmp_path):
  """At 0.01 x the loss, 2^15 x its gradient overflows float16 within steps: each such step halves the scale."""
  config = runs.override(weighted_tasks.config(steps=12), {"dtype": "float16", "task.factor": OVERFLOWING,
                                                          "learning_rate": 0.2 / OVERFLOWING})
  weighted_tasks.train(config, str(tmp_path), weighted_tasks.arrays(), task=weighted_tasks.scaled)
  records = [r for r in metrics.read(str(tmp_path)) if "train/loss_scale" in r]
  scales = [r["train/loss_scale"] for r in records]
  overflows = [r["train/overflow"] for r in records]
  assert len(records) == 12 and sum(overflows) > 0, records
  assert scales[0] == loss_scale.INITIAL_SCALE
  for scale, overflow, after in zip(scales, overflows, scales[1:]):
    assert after == (scale / 2 if overflow else scale), (scales, overflows)
  assert all(r["train/nonfinite"] == 0 for r in records)  # An overflow is the scale's, not a failing run.


def test_the_scale_halves_on_a_nonfinite_step_and_doubles_after_the_growth_interval():
  s = loss_scale.initial("float16")
  assert loss_scale.initial("bfloat16") is None and loss_scale.initial("float32") is None
  halved = s.update(jnp.bool_(False))
  assert (float(halved.scale), int(halved.good_steps)) == (loss_scale.INITIAL_SCALE / 2, 0)
  assert float(loss_scale.LossScale(jnp.float32(1), jnp.int32(0)).update(jnp.bool_(False)).scale) == 1.0  # Floor.
  for _ in range(loss_scale.GROWTH_INTERVAL - 1):
    s = s.update(jnp.bool_(True))
  assert (float(s.scale), int(s.good_steps)) == (loss_scale.INITIAL_SCALE, loss_scale.GROWTH_INTERVAL - 1)
  s = s.update(jnp.bool_(True))
  assert (float(s.scale), int(s.good_steps)) == (2 * loss_scale.INITIAL_SCALE, 0)


def _script(workdir, steps: int, devices: int = 8) -> subprocess.Popen:
  """tests/weighted_tasks.py in float16 at a loss factor whose first steps overflow, checkpointing every 4 steps."""
  env = {**os.environ, "JAXDP_CPU_DEVICES": str(devices)}
  return subprocess.Popen([sys.executable, os.path.join(TESTS, "weighted_tasks.py"), str(workdir), "--steps",
                           str(steps), "--float16", str(OVERFLOWING), "--checkpoint_every", "4"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_float16_resumes_bitwise_after_sigkill_scale_included(tmp_path):
  steps = 16
  runs.finish(_script(tmp_path / "straight", steps))
  proc = _script(tmp_path / "killed", steps * 50)
  runs.wait_for(lambda: (tmp_path / "killed" / "checkpoints" / "8").is_dir(), timeout=240)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.communicate(timeout=30)
  assert 8 <= checkpoint.steps(str(tmp_path / "killed"))[-1] < steps
  runs.finish(_script(tmp_path / "killed", steps))
  finals = []
  for run in ("straight", "killed"):
    with np.load(tmp_path / run / "final.npz") as f:
      finals.append({k: f[k] for k in f})
  assert any("loss_scale" in k for k in finals[0])
  assert float(finals[0]["['loss_scale'].scale"]) < loss_scale.INITIAL_SCALE  # The scale moved: resuming must keep it.
  runs.assert_bitwise(finals[1], finals[0])
