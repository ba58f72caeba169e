"""The Python API with objects: models (NNX class or instance, linen module), tasks and in-memory data passed to
`train_and_evaluate`; a workdir trained so says at `jaxdp.evaluate` what to pass; a user's script and task
resume bitwise (SIGKILL, 8 -> 4 devices) and run under `jaxdp.launch` in 2 processes like in one."""

import os
import signal
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest
import runs
from flax import linen, nnx

import my_train
import user_models
from jaxdp import build, models, train
from jaxdp import objects
from jaxdp.config import ConfigError
from jaxdp.report import metrics
from jaxdp.tools import audit, evaluate, restore

TESTS = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(TESTS, "my_train.py")


def _digits(config: ml_collections.ConfigDict, steps: int = 8) -> ml_collections.ConfigDict:
  """`config` (conftest's) with no model fields of its own (an object replaces the model) and an eval at the end."""
  config.model = ml_collections.ConfigDict({"name": "mlp"})
  config.num_train_steps, config.eval_every_steps, config.log_every_steps = steps, steps, steps
  return config


def _untrained_eval_loss(config: ml_collections.ConfigDict, model) -> float:
  """The eval loss of the model's init: the bar a trained model must get under."""
  from jaxdp.loop import evaluate as eval_loop
  parts = build.build(config, model=model)
  return eval_loop.run(parts, parts.backend.init(parts.init))["eval/loss"]


@pytest.mark.parametrize("make", [
    lambda: user_models.NNXNet,  # An NNX class: built from the seed, its kwargs from the config.
    lambda: user_models.NNXNet(64, 10, rngs=nnx.Rngs(3)),  # An NNX instance: its parameters are the init.
    lambda: user_models.LinenBNNet(width=16),  # A linen module (with BatchNorm state).
], ids=["nnx_class", "nnx_instance", "linen"])
def test_model_objects_train(config, tmp_path, make):
  config = _digits(config, steps=16)
  if make() is user_models.NNXNet:
    with config.model.unlocked():
      config.model.in_features = 64  # A class's kwargs still come from the config.
  before = _untrained_eval_loss(config, make())
  result = train.train_and_evaluate(config, str(tmp_path), model=make())
  assert result.eval_metrics["eval/loss"] < before - 0.1, (before, result.eval_metrics)


def test_an_nnx_instance_is_the_init_whatever_the_seed(config):
  module = user_models.NNXNet(64, 10, rngs=nnx.Rngs(7))
  expected = nnx.to_pure_dict(nnx.state(module, nnx.Param))
  for seed in (0, 1):
    config.seed = seed
    params, _ = build.build(_digits(config), model=module).model.init(jax.random.PRNGKey(seed))
    runs.assert_bitwise(params, expected)
  assert isinstance(module.linear.kernel[...], jax.Array)  # The module itself is left as it was.


def test_a_model_that_is_no_module_is_one_config_error(config):
  with pytest.raises(ConfigError, match="is not a Flax NNX or linen Module"):
    build.build(_digits(config), model=lambda x: x)


@pytest.mark.parametrize("model, words", [
    ({"name": "collections:OrderedDict"}, "model 'collections:OrderedDict' is not a Flax NNX or linen Module class"),
    ({"name": "mlp", "widths": (8,)}, "model 'mlp' does not accept the config's fields: .*'widths'"),
    ({"name": "user_models:LinenBNNet", "depth": 2}, "model 'user_models:LinenBNNet' does not accept the config's"),
])
def test_a_model_name_or_field_that_does_not_fit_is_one_config_error(model, words):
  with pytest.raises(ConfigError, match=words):
    models.get_model(ml_collections.ConfigDict(model), (8, 8, 1), 10)


@pytest.fixture(scope="module")
def object_workdir(data_dir, tmp_path_factory):
  """A run whose model was an NNX class passed from Python (stored as '<object user_models.NNXNet>')."""
  config = runs.config_with({"dataset.data_dir": data_dir, "batch_size": 32, "num_train_steps": 4,
                             "log_every_steps": 2, "eval_every_steps": 4, "checkpoint_every_steps": 4})
  config.model = ml_collections.ConfigDict({"name": "mlp", "in_features": 64})
  workdir = tmp_path_factory.mktemp("object")
  train.train_and_evaluate(config, str(workdir), model=user_models.NNXNet)
  last = [r for r in metrics.read(str(workdir)) if "eval/loss" in r][-1]
  return workdir, last


def test_evaluating_an_object_workdir_names_the_argument_to_pass(object_workdir, capsys):
  workdir, _ = object_workdir
  assert restore.stored_config(str(workdir)).model.name == "<object user_models.NNXNet>"
  status = evaluate.main(["jaxdp.evaluate", "--workdir", str(workdir)])
  err = capsys.readouterr().err.strip().splitlines()
  assert status == 2 and len(err) == 1, err
  assert err[0].startswith("error: the run in ") and "model <object user_models.NNXNet>" in err[0], err
  assert "jaxdp.evaluate.evaluate(config, workdir, model=NNXNet)" in err[0], err


def test_sampling_an_object_workdir_names_the_argument_to_pass(object_workdir, capsys):
  from jaxdp.tools import sample
  assert sample.main(["jaxdp.sample", "--workdir", str(object_workdir[0])]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "jaxdp.sample.load_model(config, workdir, model=NNXNet)" in err[0], err


def test_evaluate_from_python_with_the_object_reproduces_the_run(object_workdir):
  workdir, last = object_workdir
  step, results = evaluate.evaluate(restore.stored_config(str(workdir)), str(workdir), model=user_models.NNXNet)
  assert step == 4
  for key in ("eval/loss", "eval/accuracy", "eval/num_examples"):
    assert results[key] == last[key], key


def test_a_main_class_name_counts_as_an_object():
  config = ml_collections.ConfigDict({"model": {"name": "__main__:Net"}, "task": {"name": "my_tasks:focal"},
                                      "dataset": {"name": "digits"}})
  assert objects.passed_objects(config) == {"model": "__main__:Net"}


STEPS = 40  # The script checkpoints every 8 steps.


def _script(workdir, data_dir, *args, devices=8, steps=STEPS) -> subprocess.Popen:
  """tests/my_train.py (a user's script: model, task and invariant mode of its own) on `devices` CPU devices."""
  env = {**os.environ, "JAXDP_CPU_DEVICES": str(devices)}
  return subprocess.Popen([sys.executable, SCRIPT, "--workdir", str(workdir), "--data_dir", data_dir, "--steps",
                           str(steps), "--checkpoint_every", "8", "--invariant", "--save", *args], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.fixture(scope="module")
def user_reference(data_dir, tmp_path_factory):
  """The user's script uninterrupted on 1 process x 8 devices: final parameters and workdir."""
  workdir = tmp_path_factory.mktemp("user_reference")
  runs.finish(_script(workdir, data_dir))
  return runs.final(workdir), workdir


def test_the_user_script_logs_its_own_metrics_and_stores_main_objects(user_reference):
  _, workdir = user_reference
  records = metrics.read(str(workdir))
  assert any("train/max_err" in r and "train/abs_err" in r for r in records)
  assert any("eval/max_err" in r and "eval/abs_err" in r for r in records)
  losses = [r["train/loss"] for r in records if "train/loss" in r]
  assert np.mean(losses[-8:]) < 0.6 * np.mean(losses[:8]), losses  # The two-input model trains.
  stored = restore.stored_config(str(workdir))
  assert stored.model.name == "<object __main__.Net>" and stored.task.name == "<object __main__.huber>", stored


def test_evaluate_with_the_script_objects_prints_the_user_metrics(user_reference, capsys):
  _, workdir = user_reference
  assert evaluate.main(["jaxdp.evaluate", "--workdir", str(workdir)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "model=Net, task=huber)" in err[0], err
  config = restore.stored_config(str(workdir))
  step, results = evaluate.evaluate(config, str(workdir), model=my_train.Net, task=my_train.huber)
  last = [r for r in metrics.read(str(workdir)) if "eval/loss" in r][-1]
  assert step == STEPS and {"eval/loss", "eval/abs_err", "eval/max_err"} <= results.keys(), results
  for key in ("eval/loss", "eval/abs_err", "eval/max_err", "eval/num_examples"):
    assert results[key] == last[key], key


def test_a_user_task_resumes_bitwise_after_sigkill(data_dir, tmp_path, user_reference):
  proc = _script(tmp_path, data_dir, steps=STEPS * 50)
  runs.wait_for(lambda: (tmp_path / "checkpoints" / "8").is_dir(), timeout=240)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.communicate(timeout=30)
  from jaxdp import checkpoint
  assert 8 <= checkpoint.steps(str(tmp_path))[-1] < STEPS
  runs.finish(_script(tmp_path, data_dir))
  runs.assert_bitwise(runs.final(tmp_path), user_reference[0])


def test_a_user_task_resumes_from_8_on_4_devices_bitwise(data_dir, tmp_path, user_reference):
  runs.finish(_script(tmp_path, data_dir, steps=16))
  out = runs.finish(_script(tmp_path, data_dir, devices=4))
  assert "over 2 runs" in out and "step 17/40" in out and "step 16/40" not in out, out[-2000:]  # Resumed at 16.
  runs.assert_bitwise(runs.final(tmp_path), user_reference[0])


def test_two_launched_processes_run_a_user_script_like_one(data_dir, tmp_path, user_reference):
  """`jaxdp.launch -- my_train.py`: each process's train_and_evaluate joins the run; a task named module:function."""
  ref_params, ref_dir = user_reference
  args = ["--num_processes", "2", "--devices_per_process", "4", "--", SCRIPT, "--workdir", str(tmp_path),
          "--data_dir", data_dir, "--steps", str(STEPS), "--checkpoint_every", "8", "--invariant", "--save",
          "--task_name", "my_train:huber"]
  out = runs.finish(subprocess.Popen([sys.executable, "-m", "jaxdp.launch", *args], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True))
  assert "[0] step" in out and "[1] step" not in out, out[-2000:]  # Two processes, one reporting.
  assert restore.stored_config(str(tmp_path)).task.name == "my_train:huber"
  assert audit.main(["audit", str(ref_dir), str(tmp_path)]) == 0  # The same global batches, step by step.
  runs.assert_bitwise(runs.final(tmp_path), ref_params)  # Invariant mode: 2 x 4 devices as 1 x 8.


def test_a_two_input_model_trains_on_in_memory_features_and_evaluates_from_python(data_dir, tmp_path, capsys):
  """my_train.py --in_memory: the same features as arrays; the workdir names model, task and eval_data to pass."""
  runs.finish(_script(tmp_path, data_dir, "--in_memory", steps=24))
  records = metrics.read(str(tmp_path))
  losses = [r["train/loss"] for r in records if "train/loss" in r]
  assert np.mean(losses[-6:]) < 0.6 * np.mean(losses[:6]), losses
  assert evaluate.main(["jaxdp.evaluate", "--workdir", str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].endswith("model=Net, task=huber, eval_data=dict(...)) from Python with the same "
                                          "objects"), err
  stored = restore.stored_config(str(tmp_path))  # The train split passed in place of the eval split's name will do.
  given = objects.Objects(my_train.Net, my_train.huber, train_data={})
  restore.check_objects(stored, str(tmp_path), given, "evaluate")
  step, results = evaluate.evaluate(restore.stored_config(str(tmp_path)), str(tmp_path), model=my_train.Net,
                                    task=my_train.huber, eval_data=my_train.make_data(20, 1))
  last = [r for r in records if "eval/loss" in r][-1]
  assert step == 24 and all(results[k] == last[k] for k in ("eval/loss", "eval/max_err", "eval/num_examples"))


class _TwoInputLinen(linen.Module):
  """linen, two inputs: its init needs both, which only the task knows how to feed."""

  @linen.compact
  def __call__(self, image: jax.Array, mask: jax.Array, train: bool) -> jax.Array:
    x = image.astype(jax.numpy.float32) * mask[..., None]
    return linen.Dense(2)(x.reshape(x.shape[0], -1))


def test_users_convolutional_models_train_the_same_bits_on_1_2_4_8_devices_in_invariant_mode(tmp_path):
  """tests/conv_train.py (two convolutions; a per-pixel dense layer and a convolution) in a process per count.

  XLA's CPU thread pool has max(PJRT_NPROC, devices) threads, and Eigen splits a convolution's weight-gradient
  sum by it: PJRT_NPROC=1 (as on one core) gives each count its own pool unless invariant mode fixes it.
  """
  procs = {n: subprocess.Popen([sys.executable, os.path.join(TESTS, "conv_train.py"), str(tmp_path / f"{n}.npz")],
                               env={**os.environ, "JAXDP_CPU_DEVICES": str(n), "PJRT_NPROC": "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
           for n in (1, 2, 4, 8)}
  for proc in procs.values():
    runs.finish(proc)
  params = {n: dict(np.load(tmp_path / f"{n}.npz")) for n in procs}
  assert len(params[1]) == 8
  for n in (2, 4, 8):
    different = [k for k in params[1] if not np.array_equal(params[1][k], params[n][k])]
    assert not different, (n, different)


def test_a_linen_module_of_two_inputs_is_initialized_on_what_the_task_feeds_it():
  spec = {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in my_train.make_data(1, 0).items()}
  model = models.get_model(ml_collections.ConfigDict({"name": "mlp"}), (), 0, module=_TwoInputLinen(),
                           task=my_train.huber, element_spec=spec)
  params, _ = model.init(jax.random.PRNGKey(0))
  assert params["Dense_0"]["kernel"].shape == (8 * 8 * 3, 2)
  data = my_train.make_data(4, 0)
  bound = lambda *a, **k: model.apply(params, {}, *a, train=False, **k)[0]  # noqa: E731
  loss, found = my_train.huber(bound, jax.tree.map(jax.numpy.asarray, data))
  assert loss.shape == (4,) and set(found) == {"abs_err", "max_err"}


def test_a_task_that_never_calls_its_linen_model_is_one_config_error():
  spec = {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in my_train.make_data(1, 0).items()}

  def constant(model, batch):
    return jax.numpy.zeros(batch["image"].shape[0]), {}

  with pytest.raises(ConfigError, match="task 'constant' never calls the model"):
    models.get_model(ml_collections.ConfigDict({"name": "mlp"}), (), 0, module=_TwoInputLinen(), task=constant,
                     element_spec=spec)


def test_the_configs_own_input_shape_and_num_classes_win_over_the_datasets():
  config = ml_collections.ConfigDict({"name": "mlp", "hidden": (4,), "num_classes": 7, "input_shape": (3, 2)})
  params, _ = models.get_model(config, (8, 8, 1), 10).init(jax.random.PRNGKey(0))
  assert params["hidden"][0]["kernel"].shape == (6, 4) and params["head"]["kernel"].shape == (4, 7)
  del config.num_classes, config.input_shape
  params, _ = models.get_model(config, (8, 8, 1), 10).init(jax.random.PRNGKey(0))
  assert params["hidden"][0]["kernel"].shape == (64, 4) and params["head"]["kernel"].shape == (4, 10)
