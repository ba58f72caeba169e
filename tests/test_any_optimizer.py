"""Any optax optimizer: named by the config (with its arguments), or passed as an object (schedules inside it);
the same training either way, on plain and ZeRO-1; ZeRO-1 refuses one that is not elementwise; a workdir trained
with an object resumes bitwise and evaluates without it."""

import copy
import os
import signal
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest
import runs

from jaxdp import build, optim, train
from jaxdp.config import ConfigError
from jaxdp.strategies import zero1_check
from jaxdp.tools import evaluate, restore

TESTS = os.path.dirname(os.path.abspath(__file__))
LR, WD, STEPS = 1e-3, 1e-3, 8


def _config(config, zero1: bool = False, **overrides):
  config.num_train_steps, config.learning_rate, config.weight_decay, config.weight_decay_mask = STEPS, LR, WD, "all"
  config.parallel.shard_optimizer_state = zero1
  for key, value in overrides.items():
    config[key] = value
  return config


def _train(config, tmp_path, name: str, **kwargs) -> dict:
  return runs.host_state(train.train_and_evaluate(config, str(tmp_path / name), **kwargs))["params"]


def _close(a, b) -> bool:
  return all(np.allclose(x, y, rtol=1e-5, atol=1e-7) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("norm", [1.0, 0.01])  # The clip, and one small enough to act on every step.
def test_config_lion_with_max_grad_norm_trains_as_a_clipped_lion_object(config, tmp_path, norm):
  # jaxdp's max_grad_norm clips the reduced gradient; on plain data parallelism the chain's clip sees the same one.
  named = _train(_config(config.copy_and_resolve_references(), optimizer="lion", max_grad_norm=norm), tmp_path, "a")
  tx = optax.chain(optax.clip_by_global_norm(norm), optax.lion(LR, weight_decay=WD))
  passed = _train(_config(config.copy_and_resolve_references()), tmp_path, "b", optimizer=tx)
  assert _close(named, passed)
  if norm < 1:  # The clip acts (Lion's sign update shows it only through the momentum's mix): the test could fail.
    lion = optax.lion(LR, weight_decay=WD)
    assert not _close(named, _train(_config(config.copy_and_resolve_references()), tmp_path, "c", optimizer=lion))


def test_under_zero1_lion_objects_and_names_train_as_unsharded(config, tmp_path):
  lion = optax.lion(LR, weight_decay=WD)
  plain = _train(_config(config.copy_and_resolve_references(), optimizer="lion", max_grad_norm=1.0), tmp_path, "a")
  named = _train(_config(config.copy_and_resolve_references(), True, optimizer="lion", max_grad_norm=1.0), tmp_path,
                 "b")
  passed = _train(_config(config.copy_and_resolve_references(), True, max_grad_norm=1.0), tmp_path, "c",
                  optimizer=lion)
  assert _close(named, plain) and _close(passed, plain)


def test_a_warmup_cosine_schedule_object_trains_as_the_configs_cosine(config, tmp_path):
  named = _train(_config(config.copy_and_resolve_references(), optimizer="adamw", lr_schedule="cosine",
                         warmup_steps=2), tmp_path, "a")
  tx = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, LR, 2, STEPS), weight_decay=WD)
  passed = _train(_config(config.copy_and_resolve_references()), tmp_path, "b", optimizer=tx)
  constant = _train(_config(config.copy_and_resolve_references()), tmp_path, "c", optimizer=optax.adamw(LR, weight_decay=WD))
  assert _close(named, passed) and not _close(named, constant)


@pytest.mark.parametrize("tx, words", [
    (optax.chain(optax.clip_by_global_norm(1.0), optax.lion(LR)), "reads other elements"),
    (optax.adafactor(LR, min_dim_size_to_factor=8), "parameters' shapes decide"),
    (optax.adafactor(LR, factored=False), "reads other elements"),  # Its update clipped by each leaf's RMS.
])
def test_zero1_refuses_an_optimizer_that_is_not_elementwise_naming_it(config, tx, words):
  config = _config(config, True)
  with pytest.raises(ConfigError, match=f"optimizer <object optax.* cannot run under .*ZeRO-1.*{words}") as e:
    build.build(config, optimizer=tx)
  assert "\n" not in str(e.value)


def test_zero1_refuses_a_named_optimizer_that_is_not_elementwise(config):
  with pytest.raises(ConfigError, match="optimizer 'adafactor' cannot run under"):
    build.build(_config(config, True, optimizer="adafactor", optimizer_kwargs={"min_dim_size_to_factor": 8}))


@pytest.mark.parametrize("tx", [optax.sgd(LR, momentum=0.9), optax.adamw(LR), optax.lion(LR), optax.adam(LR),
                                optax.chain(optax.add_decayed_weights(WD), optax.sgd(LR))])
def test_elementwise_chains_pass_the_zero1_probe(tx):
  params = {"a": jax.ShapeDtypeStruct((5, 7), np.float32), "b": jax.ShapeDtypeStruct((3,), np.float32)}
  assert zero1_check.refusal(tx, params, 8) is None


@pytest.mark.parametrize("name, kwargs", [("lion", {}), ("adafactor", {}), ("rmsprop", {"decay": 0.5}),
                                          ("lamb", {"b1": 0.8})])
def test_the_config_names_any_optax_optimizer_with_its_arguments(config, name, kwargs):
  config = _config(config, optimizer=name, optimizer_kwargs=kwargs)
  tx = optim.make(config, {"w": np.ones((2, 3), np.float32)})
  updates, _ = tx.update({"w": np.ones((2, 3), np.float32)}, tx.init({"w": np.ones((2, 3), np.float32)}),
                         {"w": np.ones((2, 3), np.float32)})
  assert np.all(np.isfinite(updates["w"])) and np.any(updates["w"] != 0)


def test_optimizer_kwargs_reach_the_optimizer(config):
  params = {"w": np.ones((3,), np.float32)}

  def second_update(b1: float) -> np.ndarray:
    tx = optim.make(_config(config, optimizer="adam", optimizer_kwargs={"b1": b1}), params)
    state = tx.init(params)
    _, state = tx.update({"w": np.ones(3, np.float32)}, state, params)
    return tx.update({"w": -np.ones(3, np.float32)}, state, params)[0]["w"]

  assert not np.allclose(second_update(0.9), second_update(0.5))


@pytest.mark.parametrize("name, kwargs, words", [
    ("lionn", {}, "unknown optimizer 'lionn': config.optimizer names an optax optimizer"),
    ("chain", {}, "unknown optimizer 'chain'"),
    ("lion", {"b3": 1.0}, "optimizer_kwargs .*'b3'.* do not fit optax.lion"),
    ("lion", {"learning_rate": 1.0}, "optimizer_kwargs sets learning_rate: set the config's own key"),
])
def test_a_bad_optimizer_name_or_argument_is_one_config_error(config, name, kwargs, words):
  with pytest.raises(ConfigError, match=words):
    optim.make(_config(config, optimizer=name, optimizer_kwargs=kwargs))


def test_an_optimizer_that_is_no_gradient_transformation_is_one_config_error(config):
  with pytest.raises(ConfigError, match="optimizer must be an optax GradientTransformation.*got function"):
    build.build(config, optimizer=optax.lion)


def _script(workdir, data_dir, steps: int) -> subprocess.Popen:
  env = {**os.environ, "JAXDP_CPU_DEVICES": "4"}
  return subprocess.Popen([sys.executable, os.path.join(TESTS, "optim_train.py"), str(workdir), data_dir, str(steps)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)


def test_an_optimizer_object_resumes_bitwise_after_sigkill_and_evaluates_without_it(data_dir, tmp_path, capsys):
  reference, resumed = tmp_path / "reference", tmp_path / "resumed"
  runs.finish(_script(reference, data_dir, 24))
  proc = _script(resumed, data_dir, 24 * 50)
  runs.wait_for(lambda: (resumed / "checkpoints" / "8").is_dir(), timeout=240)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.communicate(timeout=30)
  runs.finish(_script(resumed, data_dir, 24))
  runs.assert_bitwise(runs.final(resumed), runs.final(reference))
  assert restore.stored_config(str(resumed)).optimizer.startswith("<object optax.")
  assert evaluate.main(["jaxdp.evaluate", "--workdir", str(resumed)]) == 0, capsys.readouterr().err
  assert '"eval/accuracy"' in capsys.readouterr().out


def test_an_optimizer_object_in_the_config_trains_as_one_passed_and_evaluates_without_it(config, tmp_path, capsys):
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.lion(1e-4))
  passed = _train(_config(copy.deepcopy(config)), tmp_path, "passed", optimizer=tx)
  in_config = copy.deepcopy(config)  # Not copy_and_resolve_references: that fixes the field's type to str.
  in_config.optimizer = tx
  assert _close(_train(_config(in_config, checkpoint_every_steps=STEPS), tmp_path, "config"), passed)  # Not adam.
  assert restore.stored_config(str(tmp_path / "config")).optimizer.startswith("<object optax.")
  assert evaluate.main(["jaxdp.evaluate", "--workdir", str(tmp_path / "config")]) == 0, capsys.readouterr().err
  assert '"eval/accuracy"' in capsys.readouterr().out


def test_the_command_line_sets_optimizer_kwargs(tmp_path):
  from jaxdp.configs import default
  from jaxdp.tools import cli
  config, _ = cli.parse(["train", "--config", default.__file__, "--config.optimizer=lion",
                         "--config.optimizer_kwargs.b1=0.95"], require_workdir=False)
  assert config.optimizer == "lion" and config.optimizer_kwargs.b1 == 0.95
