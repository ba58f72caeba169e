"""Fully sharded data parallelism (`parallel.shard_params`): the state really sharded, the same training as one
device and as plain DDP (weighted loss, micro-batches, 2 processes), checkpoints across strategies and device counts,
bitwise resume after SIGKILL, whole host copies, and one-line refusals of what it cannot serve."""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable

import jax
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import fsdp_train
import jaxdp
import runs
import weighted_tasks
from jaxdp import build, checkpoint, strategies
from jaxdp.config import ConfigError
from jaxdp.loop import replicas, train
from jaxdp.report import metrics, summary
from jaxdp.strategies import fsdp
from jaxdp.tools import inspect

TESTS = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(TESTS, "fsdp_train.py")
# A script's processes import jaxdp from this checkout (installed or not), and the tests' helpers beside it.
ENV = {**os.environ,
       "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(TESTS), os.environ.get("PYTHONPATH")]))}


def _rel(a: dict, b: dict) -> float:
  """Relative L2 distance of two flat dicts of arrays (by key)."""
  assert a.keys() == b.keys()
  a, b = (np.concatenate([np.ravel(t[k]) for k in sorted(t)]).astype(np.float64) for t in (a, b))
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
  return fsdp_train.train(str(tmp_path_factory.mktemp("one")), num_devices=1)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
  return fsdp_train.train(str(tmp_path_factory.mktemp("sharded")), shard_params=True)


def test_8_sharded_devices_train_the_one_device_weighted_objective(tmp_path, one_device, sharded):
  assert _rel(sharded, one_device) < 1e-5
  assert _rel(sharded, fsdp_train.train(str(tmp_path), steps=0)) > 0.1  # 30 Adam steps moved it far.


def test_4_micro_batches_on_8_sharded_devices_train_the_one_device_objective(tmp_path, one_device):
  assert _rel(fsdp_train.train(str(tmp_path), shard_params=True, grad_accum_steps=4), one_device) < 1e-5


def test_shard_params_trains_as_plain_ddp_on_8_devices(tmp_path, sharded):
  assert _rel(sharded, fsdp_train.train(str(tmp_path))) < 1e-6


def test_the_layout_shards_each_leaf_on_its_largest_dimension_the_devices_divide():
  assert fsdp.spec((64, 32), 8) == P("data") and fsdp.spec((32, 64), 8) == P(None, "data")
  assert fsdp.spec((10,), 8) == P() and fsdp.spec((), 8) == P() and fsdp.spec((4,), 8) == P()
  assert fsdp.spec((12, 40), 8) == P(None, "data") and fsdp.spec((64, 32), 1) == P()


def test_parameters_and_optimizer_state_are_sharded_and_host_copies_whole():
  dp = jaxdp.DataParallel(shard_params=True)
  state = dp.init(weighted_tasks.MLP(rngs=nnx.Rngs(0)), optax.adam(1e-2))
  kernel, bias = state.params["hidden"]["kernel"], state.params["out"]["bias"]
  assert kernel.sharding.spec == P("data") and kernel.addressable_data(0).shape == (8, 32)
  assert bias.sharding.spec == P() and bias.addressable_data(0).shape == (10,)  # 10: no split over 8.
  mu = state.opt_state[0].mu["hidden"]["kernel"]
  assert mu.sharding.spec == P("data") and mu.addressable_data(0).shape == (8, 32)
  host = dp.backend.get(state.params)
  assert host["hidden"]["kernel"].shape == (64, 32)
  np.testing.assert_array_equal(host["hidden"]["kernel"], np.asarray(kernel))


def test_hooks_and_the_result_see_whole_parameters_and_the_summary_says_what_a_device_holds(tmp_path, capsys):
  seen = []

  class Shapes(jaxdp.Hook):
    def on_log(self, info):
      seen.append(jax.tree.map(np.shape, info.params))

  config = weighted_tasks.config(steps=2)
  config.parallel.shard_params, config.optimizer = True, "adam"
  result = jaxdp.train_and_evaluate(config, str(tmp_path), model=weighted_tasks.MLP, task=weighted_tasks.weighted,
                                    train_data=weighted_tasks.arrays(), eval_data=weighted_tasks.arrays(),
                                    hooks=[Shapes()])
  whole = {"hidden": {"bias": (32,), "kernel": (64, 32)}, "out": {"bias": (10,), "kernel": (32, 10)}}
  assert seen and all(s == whole for s in seen)
  assert jax.tree.map(np.shape, result.params) == whole
  np.testing.assert_array_equal(result.params["hidden"]["kernel"], np.asarray(result.state.params["hidden"]["kernel"]))
  out = capsys.readouterr().out
  assert "Mesh({'data': 8}), parameters, gradients and optimizer state sharded (shard_params), batch sharded" in out
  # Of 2,410 parameters a device holds 310: 1/8 of each leaf but the 10-wide output bias, whole.
  assert "  state     per device: parameters 1.2 KiB of 9.4 KiB (12.9%), optimizer state 2.4 KiB of 18.8 KiB " \
         "(12.9%)\n" in out, out


@pytest.mark.parametrize("flag, holds", [(None, "state replicated"),
                                         ("shard_optimizer_state", "optimizer state sharded (ZeRO-1), parameters "
                                                                   "replicated")])
def test_the_summary_names_every_strategys_layout(config, flag, holds):
  if flag:
    config.parallel[flag] = True
  run = build.resolve(config)
  backend = jaxdp.DataParallel.from_config(config).backend
  line = summary.describe(config, backend, run.layout, run.ds, run.model)["backend"]
  assert line == f"mesh: jit(shard_map) over Mesh({{'data': 8}}), {holds}, batch sharded"


@pytest.mark.parametrize("first, then", [({"shard_params": True}, {"num_devices": 4}),
                                         ({"num_devices": 4}, {"shard_params": True})],
                         ids=["8_sharded_to_4_plain", "4_plain_to_8_sharded"])
def test_a_checkpoint_resumes_across_strategies_and_device_counts(tmp_path, one_device, first, then):
  fsdp_train.train(str(tmp_path), steps=15, checkpoint_every=15, **first)
  assert checkpoint.steps(str(tmp_path)) == [15]
  assert _rel(fsdp_train.train(str(tmp_path), **then), one_device) < 1e-5


def _script(workdir, *args: str, steps: int = 30) -> subprocess.Popen:
  """tests/fsdp_train.py on 8 CPU devices with shard_params, checkpointing every 8 steps."""
  return subprocess.Popen([sys.executable, SCRIPT, str(workdir), "--steps", str(steps), "--checkpoint_every", "8",
                           "--shard_params", *args], env={**ENV, "JAXDP_CPU_DEVICES": "8"}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_a_sharded_run_resumes_bitwise_after_sigkill(tmp_path, sharded):
  # The uninterrupted reference is `sharded`: the same 30 steps of the same program, in this process.
  proc = _script(tmp_path / "killed", steps=100_000)
  runs.wait_for(lambda: (tmp_path / "killed" / "checkpoints" / "8").is_dir() or proc.poll() is not None, timeout=240)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.communicate(timeout=30)
  last = checkpoint.steps(str(tmp_path / "killed"))[-1]
  assert proc.returncode == -signal.SIGKILL and 8 <= last < 30, (proc.returncode, last)  # Killed mid-run.
  runs.finish(_script(tmp_path / "killed"))
  runs.assert_bitwise(runs.final(tmp_path / "killed"), sharded)


def test_two_processes_of_4_sharded_devices_train_the_one_device_objective(tmp_path, one_device):
  proc = subprocess.run([sys.executable, "-m", "jaxdp.launch", "--num_processes", "2", "--devices_per_process", "4",
                         "--", SCRIPT, str(tmp_path), "--shard_params"], env=ENV, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
  assert _rel(runs.final(tmp_path), one_device) < 1e-5


def test_evaluate_reads_a_sharded_checkpoint_on_another_device_count(config, tmp_path_factory, trained_pairs):
  workdir = _pair(trained_pairs, config, tmp_path_factory, _clipping)[2]  # Checkpointed and evaluated at step 4.
  last = [r for r in metrics.read(workdir) if "eval/loss" in r][-1]
  out = runs.finish(runs.start("jaxdp.evaluate", ["--workdir", workdir], devices=2), timeout=300)
  record = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
  assert record["step"] == 4 and record["eval/num_examples"] == last["eval/num_examples"]
  assert record["eval/loss"] == pytest.approx(last["eval/loss"], rel=1e-5)


@pytest.mark.parametrize("overrides, words", [
    ({"parallel.invariant": True}, "shard_params cannot serve parallel.invariant: the gradient"),
    ({"parallel.shard_optimizer_state": True}, "already shards the optimizer state"),
    ({"parallel.allreduce_dtype": "bfloat16"}, "allreduce_dtype='bfloat16' cannot apply"),
    ({"parallel.backend": "pmap"}, r"parallel.shard_params \(FSDP\) needs parallel.backend 'mesh', got 'pmap'"),
])
def test_what_shard_params_cannot_serve_is_one_config_error(config, overrides, words):
  runs.override(config, {"parallel.shard_params": True, **overrides})
  with pytest.raises(ConfigError, match=words):
    build.build(config)


def test_each_flag_picks_its_strategy_and_shard_params_comes_first():
  config = ml_collections.ConfigDict({"parallel": {"shard_params": True, "invariant": True,
                                                   "shard_optimizer_state": False}})
  assert strategies.select(config) is strategies.FSDP


def test_at_dp_step_and_a_non_elementwise_optimizer_are_refused_naming_shard_params():
  dp = jaxdp.DataParallel(shard_params=True)
  with pytest.raises(ConfigError, match=r"^@dp.step takes a replicated state; shard_params \(FSDP\) serves"):
    dp.step(lambda state, batch: (state, {}))
  with pytest.raises(ConfigError, match=r"cannot run under parallel.shard_params \(FSDP\)"):
    dp.init(weighted_tasks.MLP(rngs=nnx.Rngs(0)), optax.adafactor(1e-2))


@pytest.fixture(scope="module")
def inspected(data_dir):
  """`inspect.analyze` of an MLP of four 2048-wide layers on 8 devices: plain DDP and shard_params."""
  def analyze(**overrides):
    config = runs.config_with({"dataset.data_dir": data_dir, "model.name": "mlp", "model.hidden": (2048,) * 4,
                               "batch_size": 64, **overrides})
    return inspect.analyze(config)
  return analyze(), analyze(**{"parallel.shard_params": True})


def test_a_device_holds_an_eighth_of_the_parameters_and_optimizer_state(inspected):
  plain, sharded = inspected
  whole, dev = sharded["params"]["bytes"], sharded["per_device"]
  assert dev["params_bytes"] <= (1 / 8 + 0.05) * whole
  assert dev["opt_state_bytes"] <= (1 / 8 + 0.05) * sharded["optimizer_state_bytes"]
  assert plain["per_device"]["params_bytes"] == whole  # Plain DDP: a whole copy.
  assert sharded["memory"]["total_bytes"] < 0.5 * plain["memory"]["total_bytes"]
  assert sharded["run"]["shard_params"] and "shard_params on" in inspect.format_report(sharded)


def test_the_step_gathers_each_sharded_parameter_and_reduce_scatters_its_gradient(inspected):
  plain, sharded = inspected
  sharded_leaves = 5 + 4  # The five kernels and four 2048-wide biases; the 10-wide output bias stays replicated.
  compiled, lowered = sharded["collectives"]["compiled"], sharded["collectives"]["lowered"]
  sharded_bytes = sharded["params"]["bytes"] - 10 * 4
  assert compiled["reduce-scatter"]["count"] == lowered["reduce-scatter"]["count"] == sharded_leaves
  assert compiled["reduce-scatter"]["tensor_bytes"] == sharded_bytes
  # The backward pass gathers again the four kernels it multiplies by (the remat), rather than keep them.
  assert lowered["all-gather"]["count"] == sharded_leaves + 4
  assert compiled["all-gather"]["tensor_bytes"] >= sharded_bytes
  assert compiled["all-reduce"]["tensor_bytes"] == 10 * 4  # The replicated bias's gradient; metrics are scalars.
  assert plain["collectives"]["compiled"]["all-reduce"]["tensor_bytes"] == plain["params"]["bytes"]
  assert any(n.startswith("shard_params: ") for n in sharded["notes"])


def _resnet(config):
  """A ResNet with BatchNorm synchronized over the devices, 8 channels wide (its kernels shard on 8 devices)."""
  config.model = ml_collections.ConfigDict({"name": "resnet", "stage_sizes": (1,), "width": 8,
                                            "bn_axis_name": "data"})
  config.optimizer, config.learning_rate = "sgd", 0.05


def _dropout(config):
  config.model = ml_collections.ConfigDict({"name": "dropout_models:DropoutMLP"})


def _float16(config):
  config.dtype = "float16"


def _clipping(config):
  config.max_grad_norm, config.optimizer, config.learning_rate = 0.05, "sgd", 1.0


@pytest.fixture(scope="module")
def trained_pairs() -> dict:
  """setup -> (plain DDP's final state, shard_params', shard_params' workdir): each pair trained once in this module."""
  return {}


def _pair(pairs: dict, config: ml_collections.ConfigDict, tmp_path_factory: pytest.TempPathFactory,
          setup: Callable[[ml_collections.ConfigDict], None]) -> tuple:
  """4 steps of `setup`'s config, plainly and with shard_params, trained once (the sharded clipping run checkpoints
  its last step, which the evaluate test reads)."""
  if setup not in pairs:
    setup(config)
    config.num_train_steps = 4
    finals, workdir = [], str(tmp_path_factory.mktemp(setup.__name__))
    for shard in (False, True):
      config.parallel.shard_params = shard
      config.checkpoint_every_steps = 4 if shard and setup is _clipping else 0
      result = train.train_and_evaluate(config, os.path.join(workdir, str(shard)))
      finals.append(runs.host_state(result) | {"model_state": result.model_state})
    pairs[setup] = (*finals, os.path.join(workdir, "True"))
  return pairs[setup]


@pytest.mark.parametrize("setup", [_resnet, _dropout, _float16, _clipping],
                         ids=["synced_batchnorm", "dropout", "float16_loss_scaling", "clipping"])
def test_shard_params_trains_as_plain_ddp_with(config, tmp_path_factory, trained_pairs, setup):
  plain, sharded, _ = _pair(trained_pairs, config, tmp_path_factory, setup)
  if setup is _float16:  # The loss scale ran (and parameters stay float32).
    assert {x.dtype for x in jax.tree.leaves(plain["params"])} == {np.dtype(np.float32)}
  flat = [{jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(t)
           if np.issubdtype(np.asarray(v).dtype, np.floating)} for t in (plain, sharded)]
  assert _rel(flat[1], flat[0]) < 1e-5


def test_the_replica_check_compares_the_replicated_leaves_of_a_sharded_state(config):
  config.parallel.shard_params = True
  parts = build.build(config)
  state = parts.backend.init(parts.init)
  sentinel = replicas.Sentinel(parts.backend)
  sentinel.check(state.params)  # Every device holds other shards: no replica of them differs.
  # Nor is a sharded leaf gathered whole to be compared (a model that fits no device whole stays so).
  assert [x.shape for x in parts.backend.replicated(state.params)] == [(10,)]
  leaves = jax.tree.leaves(state.params)
  k = next(i for i, x in enumerate(leaves) if x.is_fully_replicated)  # The 10-wide output bias.
  shards = [jax.device_put(np.asarray(s.data) + np.float32(s.device.id == 5), s.device)
            for s in leaves[k].addressable_shards]
  leaves[k] = jax.make_array_from_single_device_arrays(leaves[k].shape, leaves[k].sharding, shards)
  with pytest.raises(replicas.ReplicaMismatchError, match=r"device 5 \(process 0\) differ from the other 7 of 8"):
    sentinel.check(jax.tree.unflatten(jax.tree.structure(state.params), leaves))
