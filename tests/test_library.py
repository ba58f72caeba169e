"""`jaxdp.DataParallel`, the library for a loop of one's own: the loop of docs/your-own-loop.md, run as the page
shows it, trains alike on 1 device, 8 devices and 2 processes x 4 (bitwise in invariant mode) and resumes bitwise
after SIGKILL; `@dp.step` with `dp.value_and_grad` gives the global gradient, never N times it."""

import os
import pathlib
import re
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxdp
from jaxdp import checkpoint
from jaxdp.config import ConfigError
from jaxdp.tasks import Metric

import runs

PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "your-own-loop.md"
LOOP, TWO_OPTIMIZERS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)[:2]
STEPS = 60  # Past the loop's first checkpoint (every 50 steps).


def _script(body: str, workdir: pathlib.Path, data_dir: str, steps: int, **options: object) -> str:
  """The page's block as the tests run it: its workdir in `workdir`, `steps` steps, DataParallel given `options`."""
  args = ", ".join(f"{k}={v!r}" for k, v in {"data_dir": data_dir, **options}.items())
  body = re.sub(r"num_train_steps = \d+", f"num_train_steps = {steps}", body.replace("/tmp/", f"{workdir}/"))
  assert body.count("jaxdp.DataParallel()") == 1
  return body.replace("jaxdp.DataParallel()", f"jaxdp.DataParallel({args})")


def _params(dp: jaxdp.DataParallel, tree: object) -> dict[str, np.ndarray]:
  """One host copy of a replicated tree, by path."""
  return {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(dp.backend.get(tree))}


def _in_process(body: str, tmp_path: pathlib.Path, data_dir: str, steps: int = STEPS, **options: object) -> dict:
  """The block run in this process (8 fake devices): its final state's parameters on the host."""
  workdir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
  workdir.mkdir()
  namespace: dict = {"__name__": "__main__"}
  exec(compile(_script(body, workdir, data_dir, steps, **options), str(PAGE), "exec"), namespace)
  state = namespace["state"]
  return _params(namespace["dp"], getattr(state, "params", state))


SAVE_FINAL = """
import numpy as np, jax
if jax.process_index() == 0:
  leaves = jax.tree_util.tree_leaves_with_path(dp.backend.get(state.params))
  np.savez("{out}", **{{jax.tree_util.keystr(k): v for k, v in leaves}})
"""


def _start(tmp_path: pathlib.Path, data_dir: str, steps: int, launch: bool = False) -> tuple[subprocess.Popen, str]:
  """The loop (invariant mode) as its own script, one process (1 device) or launched (2 x 4); final params saved."""
  workdir = tmp_path / "work"
  workdir.mkdir(exist_ok=True)
  script, out = tmp_path / "my_loop.py", str(tmp_path / "final.npz")
  script.write_text(_script(LOOP, workdir, data_dir, steps, invariant=True) + SAVE_FINAL.format(out=out))
  argv = [sys.executable, "-m", "jaxdp.launch", "--num_processes", "2", "--devices_per_process", "4", "--",
          str(script)] if launch else [sys.executable, str(script)]
  env = {k: v for k, v in os.environ.items() if k != "JAXDP_CPU_DEVICES"}
  return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True), out


def _finish(proc: subprocess.Popen, out: str) -> dict[str, np.ndarray]:
  try:
    output, _ = proc.communicate(timeout=300)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    raise
  assert proc.returncode == 0, output[-3000:]
  with np.load(out) as f:
    return dict(f)


def _assert_close(a: dict, b: dict, rel: float) -> None:
  """Each leaf of `a` within `rel` of `b`'s, relative to its norm (an element near 0 differs by rounding alone)."""
  assert a.keys() == b.keys()
  for k in a:
    assert np.linalg.norm(a[k] - b[k]) <= rel * np.linalg.norm(b[k]), k


def test_the_page_loop_is_short_and_trains_alike_on_1_and_8_devices(tmp_path, data_dir):
  assert LOOP.count("\n") <= 30
  one = _in_process(LOOP, tmp_path, data_dir, num_devices=1)
  eight = _in_process(LOOP, tmp_path, data_dir)
  assert jax.device_count() == 8
  _assert_close(eight, one, 1e-5)
  assert any(not np.array_equal(one[k], eight[k]) for k in one)  # Plain mode: equal to rounding only.


@pytest.fixture(scope="module")
def invariant_reference(data_dir, tmp_path_factory):
  """The loop in invariant mode on 8 devices, in this process."""
  return _in_process(LOOP, tmp_path_factory.mktemp("reference"), data_dir, invariant=True)


def test_the_page_loop_in_invariant_mode_is_bitwise_on_1_8_and_2x4_devices(tmp_path, data_dir, invariant_reference):
  runs.assert_bitwise(_in_process(LOOP, tmp_path, data_dir, num_devices=1, invariant=True), invariant_reference)
  runs.assert_bitwise(_finish(*_start(tmp_path, data_dir, STEPS, launch=True)), invariant_reference)


def test_the_page_loop_killed_and_restarted_ends_bitwise_as_uninterrupted(tmp_path, data_dir, invariant_reference):
  proc, _ = _start(tmp_path, data_dir, 100_000)
  saved = tmp_path / "work" / "own_loop"
  runs.wait_for(lambda: (saved / "checkpoints" / "50").is_dir() or proc.poll() is not None, timeout=240)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.communicate(timeout=30)
  from jaxdp import checkpoint
  last = checkpoint.steps(str(saved))[-1]
  assert proc.returncode == -signal.SIGKILL and last >= 50, (proc.returncode, last)  # Killed mid-run.
  steps = max(STEPS, last + 10)  # Past the newest checkpoint, however far the killed run got.
  reference = invariant_reference if steps == STEPS else _in_process(LOOP, tmp_path, data_dir, steps, invariant=True)
  runs.assert_bitwise(_finish(*_start(tmp_path, data_dir, steps)), reference)


def test_the_two_optimizer_loop_trains_alike_on_1_and_8_devices(tmp_path, data_dir):
  one = _in_process(TWO_OPTIMIZERS, tmp_path, data_dir, 20, num_devices=1)
  eight = _in_process(TWO_OPTIMIZERS, tmp_path, data_dir, 20)
  _assert_close(eight, one, 1e-5)


def _loss(params: dict, batch: dict) -> Metric:
  """A weighted per-example loss: the global mean is Σw·ℓ/Σw, not a mean of per-device means."""
  return Metric(((batch["x"] @ params["w"] - batch["y"]) ** 2).mean(-1), weights=batch["w"])


@pytest.mark.parametrize("options", [{}, {"invariant": True}, {"grad_accum_steps": 2}])
def test_value_and_grad_gives_the_global_gradient_of_one_device(options):
  rng = np.random.default_rng(0)
  batch = {"x": rng.normal(size=(32, 4)).astype(np.float32), "y": rng.normal(size=(32, 2)).astype(np.float32),
           "w": rng.integers(0, 3, 32).astype(np.float32)}
  params = {"w": rng.normal(size=(4, 2)).astype(np.float32)}

  def mean_loss(p: dict) -> jax.Array:
    m = _loss(p, batch)
    return (m.values * m.weights).sum() / m.weights.sum()

  want_loss, want = jax.value_and_grad(mean_loss)(params)
  dp = jaxdp.DataParallel(**options)
  assert dp.num_devices == 8

  @dp.step
  def step(params: dict, batch: dict) -> tuple:
    loss, grads = dp.value_and_grad(_loss)(params, batch)
    return params, (loss, grads)

  _, (loss, grads) = step(dp.replicate(params), dp.backend.put_step(batch))
  np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(grads["w"]), np.asarray(want["w"]), rtol=1e-5)


def test_restore_refuses_a_stream_other_than_the_checkpoints(tmp_path):
  rng = np.random.default_rng(0)
  arrays = {"inputs": rng.normal(size=(64, 4)).astype(np.float32), "labels": rng.integers(0, 2, 64)}
  from flax import nnx
  dp = jaxdp.DataParallel()
  state = dp.init(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), optax.sgd(0.1))
  step = dp.train_step()
  for batch in dp.batches(arrays, batch_size=16, seed=0, stop_step=2):
    state = step(state, batch)[0]
  assert dp.save(str(tmp_path), state) == 2
  assert checkpoint.steps(str(tmp_path)) == [2]  # Complete when `save` returns, though written in the background.
  again = jaxdp.DataParallel()
  restored, start = again.restore(str(tmp_path), again.init(nnx.Linear(4, 2, rngs=nnx.Rngs(1)), optax.sgd(0.1)))
  assert start == 2
  runs.assert_bitwise(_params(again, restored.params), _params(dp, state.params))
  with pytest.raises(ConfigError, match="seed 0 -> 1"):
    again.batches(arrays, batch_size=16, seed=1, start_step=start)
  with pytest.raises(ConfigError, match=r"batch_size \(12\) must be divisible by the number of devices \(8\)"):
    again.batches(arrays, batch_size=12, start_step=start)


def _arrays(n: int = 64) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  return {"inputs": rng.normal(size=(n, 4)).astype(np.float32), "labels": rng.integers(0, 2, n).astype(np.int32)}


def _train(dp: jaxdp.DataParallel, model: object, steps: int = 3, **init: object) -> dict[str, np.ndarray]:
  state = dp.init(model, optax.adam(0.1), **init)
  step = dp.train_step()
  for batch in dp.batches(_arrays(), batch_size=16, stop_step=steps):
    state = step(state, batch)[0]
  return _params(dp, state.params)


def test_zero1_through_train_step_trains_as_plain_and_at_dp_step_is_refused():
  from flax import nnx
  plain = _train(jaxdp.DataParallel(), nnx.Linear(4, 2, rngs=nnx.Rngs(0)))
  zero = jaxdp.DataParallel(shard_optimizer_state=True)
  _assert_close(_train(zero, nnx.Linear(4, 2, rngs=nnx.Rngs(0))), plain, 1e-5)
  assert any(not np.allclose(v, 0) for v in plain.values())
  with pytest.raises(ConfigError, match="ZeRO-1"):
    zero.step(lambda state, batch: (state, {}))


def test_a_linen_module_and_an_nnx_class_initialize_from_the_seed():
  from flax import linen, nnx

  class Linear(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      self.linear = nnx.Linear(4, 2, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
      return self.linear(x)

  class Dense(linen.Module):  # jaxdp calls a linen module with `train` (models.adapter.from_linen).
    @linen.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
      return linen.Dense(2)(x)

  dp = jaxdp.DataParallel(num_devices=2)
  for model, init in ((Dense(), {"inputs": np.zeros((1, 4), np.float32)}), (Linear, {})):
    first, again, other = (_train(dp, model, 1, seed=seed, **init) for seed in (0, 0, 1))
    runs.assert_bitwise(first, again)
    assert any(not np.array_equal(first[k], other[k]) for k in first)
  with pytest.raises(ConfigError, match=r"dp.init\(..., inputs=x\)"):
    dp.init(Dense(), optax.sgd(0.1))


def test_a_saved_workdir_names_the_objects_jaxdp_evaluate_needs(tmp_path, capsys):
  """As train_and_evaluate's workdirs do: `jaxdp.evaluate` names the argument to pass, not a default model."""
  from flax import nnx
  from jaxdp.tools import evaluate, restore
  dp = jaxdp.DataParallel()
  _train(dp, nnx.Linear(4, 2, rngs=nnx.Rngs(0)), steps=1)
  dp.save(str(tmp_path), dp.init(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), optax.adam(0.1)))
  stored = restore.stored_config(str(tmp_path))
  assert stored.model.name == "<object flax.nnx.nn.linear.Linear instance>", stored.model.name
  assert stored.dataset.name == "<object builtins.dict instance>" and stored.optimizer.startswith("<object optax.")
  assert evaluate.main(["jaxdp.evaluate", "--workdir", str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "model=Linear" in err[0], err
