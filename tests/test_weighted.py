"""A weighted or masked loss trains one objective on any device count: Σ w·ℓ / Σ w over the whole global batch,
through every strategy, accumulation, clipping, and 2 processes; a global batch of total weight 0 is skipped."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import jaxdp
import runs
import weighted_tasks
from jaxdp import build
from jaxdp.data import order as sampler
from jaxdp.report import metrics

TESTS = os.path.dirname(os.path.abspath(__file__))


def _params(overrides: dict, workdir, data=None):
  """Final parameters of `weighted_tasks.train` with dotted-key `overrides`."""
  return weighted_tasks.train(runs.override(weighted_tasks.config(), overrides), str(workdir), data).params


def _rel(a, b) -> float:
  """Relative L2 distance of two parameter trees (or flat dicts of arrays, in leaf order)."""
  a, b = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)]).astype(np.float64) for t in (a, b))
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
  return _params({"parallel.num_devices": 1}, tmp_path_factory.mktemp("one"))


@pytest.mark.parametrize("overrides", [
    {"parallel.num_devices": 8},
    {"parallel.num_devices": 1, "grad_accum_steps": 4},
    {"parallel.num_devices": 8, "parallel.shard_optimizer_state": True},
    {"parallel.num_devices": 4, "parallel.shard_optimizer_state": True, "grad_accum_steps": 2},
], ids=["8_devices", "4_micro_batches", "zero1", "zero1_accum"])
def test_a_weighted_loss_trains_the_one_device_objective(tmp_path, one_device, overrides):
  assert _rel(_params(overrides, tmp_path), one_device) < 1e-5


def test_clipping_clips_the_global_weighted_gradient(tmp_path):
  clipped = {"max_grad_norm": 0.5}
  one = _params({**clipped, "parallel.num_devices": 1}, tmp_path / "one")
  assert _rel(_params({**clipped, "parallel.num_devices": 8, "grad_accum_steps": 2}, tmp_path / "eight"), one) < 1e-5


def _init(config, data):
  """The parameters a run of `config` on `data` starts from, on the host."""
  parts = build.build(config, model=weighted_tasks.MLP, task=weighted_tasks.weighted, train_data=data, eval_data=data)
  return parts.backend.get(parts.backend.init(parts.init).params)


def test_a_bfloat16_allreduce_updates_by_the_objective_to_its_rounding(tmp_path):
  """One step: the update on 8 devices with a bfloat16 all-reduce is the 1-device update to bfloat16's roundoff."""
  config, data = weighted_tasks.config(steps=1), weighted_tasks.arrays()
  init = _init(config, data)
  updates = [jax.tree.map(np.subtract, _params({"num_train_steps": 1, **overrides}, tmp_path / str(i), data), init)
             for i, overrides in enumerate([{"parallel.num_devices": 1},
                                            {"parallel.num_devices": 8, "parallel.allreduce_dtype": "bfloat16"}])]
  assert _rel(updates[1], updates[0]) < 2 ** -8


def test_two_processes_train_the_one_device_objective(tmp_path, one_device):
  proc = subprocess.run([sys.executable, "-m", "jaxdp.launch", "--num_processes", "2", "--devices_per_process", "4",
                         "--", os.path.join(TESTS, "weighted_tasks.py"), str(tmp_path)],
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
  with np.load(tmp_path / "final.npz") as f:
    final = {k: f[k] for k in f}
  reference = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path({"params": one_device})}
  assert final.keys() == reference.keys()
  assert _rel([final[k] for k in sorted(final)], [reference[k] for k in sorted(final)]) < 1e-5


def test_train_loss_is_the_global_batch_weighted_mean(tmp_path):
  """Step 1's `train/loss` on 8 devices, 2 micro-batches each: Σ w·ℓ / Σ w of global batch 0 at the init, by hand."""
  config = runs.override(weighted_tasks.config(steps=1), {"grad_accum_steps": 2})
  data = weighted_tasks.arrays()
  init = _init(config, data)
  rows = sampler.GlobalOrder(len(data["labels"]), config.batch_size, config.seed, "train").rows(0, 0, config.batch_size)
  expected = weighted_tasks.loss_by_hand(init, {k: v[rows] for k, v in data.items()})
  weighted_tasks.train(config, str(tmp_path), data)
  logged = [r for r in metrics.read(str(tmp_path)) if "train/loss" in r]
  assert logged[0]["step"] == 1 and logged[0]["train/loss"] == pytest.approx(expected, rel=1e-5)


def test_invariant_mode_is_bitwise_on_1_2_4_8_devices_and_the_plain_objective(tmp_path, one_device):
  finals = {n: _params({"parallel.invariant": True, "parallel.num_devices": n}, tmp_path / str(n)) for n in (1, 2, 4, 8)}
  for n, params in finals.items():
    runs.assert_bitwise(params, finals[1])
  assert _rel(finals[1], one_device) < 1e-5


def test_a_global_batch_of_total_weight_zero_is_skipped_and_counted(tmp_path):
  """Global batch 1 weighs nothing: step 2 leaves the parameters as step 1 left them, and is counted, never NaN."""
  config = weighted_tasks.config(steps=2)
  data = weighted_tasks.arrays()
  rows = sampler.GlobalOrder(len(data["labels"]), config.batch_size, config.seed, "train").rows(1, 0, config.batch_size)
  data["weight"][rows] = 0.0
  adam = {"optimizer": "adam", "learning_rate": 1e-2}  # Its momentum would move the parameters on a zero gradient.
  after_one = _params({**adam, "num_train_steps": 1}, tmp_path / "one", data)
  after_two = _params({**adam, "num_train_steps": 2}, tmp_path / "two", data)
  runs.assert_bitwise(after_two, after_one)
  step_two = [r for r in metrics.read(str(tmp_path / "two")) if r.get("step") == 2 and "train/zero_weight" in r][0]
  assert step_two["train/zero_weight"] == 1 and step_two["train/nonfinite"] == 0
  # A mean over nothing is not logged; nothing logged is NaN.
  assert "train/loss" not in step_two and "train/accuracy" not in step_two, step_two
  assert all(np.isfinite(v) for k, v in step_two.items() if k.startswith("train/")), step_two


def test_a_log_window_weighs_each_step_by_its_weight():
  """Between log steps: a mean is Σ w·v / Σ w over every step's examples; sums and maxima are averaged; counts add."""
  history = [{"loss": 1.0, "hits": 2.0, "nonfinite": 0, "zero_weight": 0, "weight": {"loss": 3.0}},
             {"loss": 2.0, "hits": 4.0, "nonfinite": 1, "zero_weight": 1, "weight": {"loss": 1.0}}]
  assert metrics.mean(history, "train") == {"train/loss": 1.25, "train/hits": 3.0, "train/nonfinite": 1.0,
                                            "train/zero_weight": 1.0}


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_negative_weights_stop_train_and_evaluate_naming_the_metric_and_the_step(tmp_path, backend):
  """Advantages passed as weights would be rescaled by their signed sum: refused, naming where."""
  config = weighted_tasks.config(steps=6)
  config.parallel.backend = backend
  data = weighted_tasks.arrays()
  rows = sampler.GlobalOrder(len(data["labels"]), config.batch_size, config.seed, "train").rows(2, 0, config.batch_size)
  data["weight"][rows[:3]] = -1.0
  with pytest.raises(jaxdp.ConfigError, match="^metric 'loss' has 3 negative weights at step 3: .* belongs in the loss"):
    weighted_tasks.train(config, str(tmp_path), data)
