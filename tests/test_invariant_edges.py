"""Invariant mode's promise at its edges: BatchNorm statistics under accumulation; deterministic GPU ops."""

import json
import os
import pickle
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxdp import parallel, strategies, train
from jaxdp.runtime import process

TESTS = os.path.dirname(os.path.abspath(__file__))


def _as_users_compile(script: str, *args: str, devices: int, **env: str) -> subprocess.CompletedProcess:
  """`python -c script TESTS *args` on `devices` CPU devices with XLA's default flags, not the suite's
  (conftest.XLA_FLAGS): where the invariant mode's bits are held as users compile; `env` added."""
  clean = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXDP_CPU_DEVICES", "NPROC")}
  clean.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu", **env)
  return subprocess.run([sys.executable, "-c", script, TESTS, *args], env=clean, capture_output=True, text=True,
                        timeout=300)


@pytest.fixture
def bn_config(config):
  """A linen BatchNorm model in invariant mode, one step on a batch of 64."""
  config.model = type(config.model)({"name": "user_models:LinenBNNet", "width": 16})
  config.parallel.invariant = True
  config.num_train_steps, config.log_every_steps, config.batch_size = 1, 1, 64
  return config


def _stats(config, workdir):
  result = train.train_and_evaluate(config, str(workdir))
  return result.backend.get(result.state.model_state)["batch_stats"]["BatchNorm_0"]


# Trains the pickled config argv[2] on 1 and 8 devices; saves run N's parameters and statistics as argv[3]_N.npz and
# its eval metrics as argv[3]_N.json.
BN_RUNS = ("import json, pickle, sys, numpy as np, jax; sys.path.insert(0, sys.argv[1]); from jaxdp import train; "
           "config, out = pickle.load(open(sys.argv[2], 'rb')), sys.argv[3]\n"
           "for n in (1, 8):\n"
           "  config.parallel.num_devices = n; r = train.train_and_evaluate(config, f'{out}_{n}')\n"
           "  np.savez(f'{out}_{n}.npz', *jax.tree.leaves(r.backend.get((r.state.params, r.state.model_state))))\n"
           "  json.dump(r.eval_metrics, open(f'{out}_{n}.json', 'w'))")


def test_batchnorm_statistics_and_eval_metrics_are_bitwise_on_1_and_8_devices(bn_config, tmp_path):
  """Three steps (the running averages nonzero from the second on), then an eval on the statistics, as users
  compile: XLA:CPU's loop emitters, which the suite's flags choose, put the statistics 1 ulp apart."""
  bn_config.num_train_steps, bn_config.eval_batch_size, bn_config.dataset.eval_split = 3, 40, "test[:80]"
  (tmp_path / "config.pkl").write_bytes(pickle.dumps(bn_config))
  done = _as_users_compile(BN_RUNS, str(tmp_path / "config.pkl"), str(tmp_path / "run"), devices=8)
  assert done.returncode == 0, done.stderr[-2000:]
  one, eight = (np.load(tmp_path / f"run_{n}.npz") for n in (1, 8))
  assert len(one.files) == 8  # Six parameters (two Dense, BatchNorm's scale and bias), then mean and variance.
  for k in one.files:
    assert one[k].tobytes() == eight[k].tobytes(), (k, np.abs(one[k] - eight[k]).max())
  assert json.loads((tmp_path / "run_1.json").read_text()) == json.loads((tmp_path / "run_8.json").read_text())


def test_batchnorm_statistics_under_accumulation_are_the_mean_over_micro_batches(bn_config, tmp_path):
  """After one step from running mean 0, the running mean is 0.1 x the batch's mean, however the batch is cut."""
  whole = _stats(bn_config, tmp_path / "whole")
  bn_config.grad_accum_steps = 2
  accumulated = _stats(bn_config, tmp_path / "accumulated")
  assert np.abs(whole["mean"]).max() > 1e-3  # Something to compare: the statistic moved.
  np.testing.assert_allclose(accumulated["mean"], whole["mean"], rtol=1e-5, atol=1e-7)


class _Bogus(strategies.Invariant):
  """Invariant, with a compile option XLA does not know: seen failing only if the backend passes it on."""

  @classmethod
  def compiler_options(cls, platform: str) -> dict:
    return {"xla_cpu_no_such_option": True}


def test_invariant_steps_compile_with_the_strategy_s_options_deterministic_ops_on_gpus():
  assert strategies.Invariant.compiler_options("gpu") == {"xla_gpu_deterministic_ops": True}
  assert strategies.Invariant.compiler_options("cpu") is None
  assert strategies.DataParallel.compiler_options("gpu") is None
  backend = parallel.make_backend("mesh", 2, _Bogus)
  batch = {"x": np.ones(4, np.float32)}
  step = backend.map_eval(lambda state, batch, axis: jax.numpy.sum(batch["x"]))
  with pytest.raises(Exception, match="No such compile option: 'xla_cpu_no_such_option'"):
    step({}, backend.put_batch(batch))
  train_step = backend.map_train(lambda state, batch, axis: (state, jax.numpy.sum(batch["x"])))
  with pytest.raises(Exception, match="No such compile option: 'xla_cpu_no_such_option'"):
    train_step({}, backend.put_step(batch))


def test_the_process_sets_deterministic_gpu_ops_first_in_xla_flags_before_jax_starts(config, monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
  process.deterministic_gpu(config, started=False)  # Plain data parallelism: XLA's defaults.
  assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
  config.parallel.invariant = True
  process.deterministic_gpu(config, started=True)  # Too late for flags: the compile options hold it.
  assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
  process.deterministic_gpu(config, started=False)
  assert os.environ["XLA_FLAGS"] == "--xla_gpu_deterministic_ops=true --xla_dump_to=/tmp/x"
  process.deterministic_gpu(config, started=False)  # Once.
  assert os.environ["XLA_FLAGS"] == "--xla_gpu_deterministic_ops=true --xla_dump_to=/tmp/x"


# A user's script: an NNX conv model made first (JAX starts there), then trained in invariant mode from Python.
CONV_FIRST = ("import sys, tempfile, numpy as np, jax, jaxdp; from flax import nnx; sys.path.insert(0, sys.argv[1]); "
              "import conv_train, user_models; from jaxdp.configs import default; "
              "model = user_models.ConvNNX(nnx.Rngs(0)); c = default.get_config(); "
              "c.model.name, c.task.name = 'mlp', ''; "
              "c.batch_size, c.eval_batch_size, c.num_train_steps, c.learning_rate = 32, 8, 2, 1e-2; "
              "c.log_every_steps = c.eval_every_steps = 2; c.checkpoint_every_steps = 0; c.parallel.invariant = True; "
              "r = jaxdp.train_and_evaluate(c, tempfile.mkdtemp(), model=model, task=conv_train.pixel_mse, "
              "train_data=conv_train.make_data(64, 0), eval_data=conv_train.make_data(8, 1)); "
              "np.savez(sys.argv[2], *[np.asarray(x) for x in jax.tree.leaves(r.params)])")


def _conv_first(devices: int, threads: int, out) -> subprocess.CompletedProcess:
  """CONV_FIRST on `devices` CPU devices, XLA:CPU's pool at `threads`, as users compile."""
  return _as_users_compile(CONV_FIRST, str(out), devices=devices, PJRT_NPROC=str(threads))


def test_a_conv_model_made_before_jaxdp_is_bitwise_or_refused_in_one_line(tmp_path):
  """JAX started by the user's model, with XLA:CPU's pool as on 2 devices: no way to hold the bits (no compile
  option reaches Eigen's convolutions), so refused, naming what works; which, followed, holds them on 1 and 2."""
  refused = _conv_first(2, 1, tmp_path / "refused.npz")
  assert refused.returncode == 1 and not (tmp_path / "refused.npz").exists(), refused.stderr[-2000:]
  last = refused.stderr.strip().splitlines()[-1]
  assert last.startswith("jaxdp.config.ConfigError: parallel.invariant: JAX started before jaxdp") and \
      "set PJRT_NPROC=8 before Python starts" in last, last
  params = {}
  for n in (1, 2):
    done = _conv_first(n, 8, tmp_path / f"{n}.npz")
    assert done.returncode == 0, done.stderr[-2000:]
    params[n] = np.load(tmp_path / f"{n}.npz")
  assert len(params[1].files) == 4
  assert all(params[1][k].tobytes() == params[2][k].tobytes() for k in params[1].files)
