"""The CLI: bad input gives one `error: ...` line naming the value, exit status 2, before training."""

import importlib
import io
import json
import logging
import os
import re
import subprocess
import sys

import pytest

from jaxdp.tools import cli, plot, restore
from jaxdp import train
from jaxdp.tools import inspect as inspect_cli
from jaxdp.config import ConfigError
from jaxdp.runtime import process
from jaxdp.configs import default

CONFIG = default.__file__


def _run(argv, capsys):
  status = train.main(["jaxdp.train", *argv])
  return status, capsys.readouterr().err.strip()


@pytest.mark.parametrize("override, named", [
    ("--config.batch_size=30", "30"),                       # Not divisible by 8 devices.
    ("--config.model.name=resnet9000", "resnet9000"),
    ("--config.dataset.name=no_such_dataset", "no_such_dataset"),
    ("--config.nokey=1", "config.nokey"),
    ("--config.learning_rate=0.0", "0.0"),
    ("--config.learning_rate=-0.1", "-0.1"),
    ("--config.learning_rate=fast", "learning_rate must be a positive number, got 'fast'"),
    ("--config.num_train_steps=0", "0"),
    ("--config.parallel.backend=horovod", "horovod"),
    ("--config.optimizer=adagrad9", "adagrad9"),
    ("--config.batch_size=abc", "abc"),
    ("--config.dataset.name.x=1", "bad config override among --config.dataset.data_dir, --config.dataset.name.x"),
])
def test_config_mistakes(data_dir, tmp_path, capsys, override, named):
  workdir = tmp_path / "run"
  status, err = _run(["--config", CONFIG, "--workdir", str(workdir), f"--config.dataset.data_dir={data_dir}",
                      override], capsys)
  assert status == 2
  assert err.startswith("error: ") and len(err.splitlines()) == 1, err
  assert named in err
  assert not (workdir / "metrics.jsonl").exists()  # Nothing trained.


def test_missing_config_file(tmp_path, capsys):
  status, err = _run(["--config", str(tmp_path / "nope.py"), "--workdir", str(tmp_path)], capsys)
  assert status == 2 and err.startswith("error: ") and "nope.py" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv, error", [
    (["--workdir", "run"], "error: --config is required (e.g. --config jaxdp/configs/default.py)"),
    (["--config", CONFIG], "error: --workdir is required"),
])
def test_a_missing_flag_is_named(capsys, argv, error):
  assert _run(argv, capsys) == (2, error)


def test_unwritable_workdir(data_dir, tmp_path, capsys):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  status, err = _run(["--config", CONFIG, "--workdir", str(blocker / "run"),
                      f"--config.dataset.data_dir={data_dir}"], capsys)
  assert status == 2 and "a_file" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv, named", [
    (["--config", "missing_config.py"], "missing_config.py"),
    (["--config", CONFIG, "--config.model.nme=mlp"], "config.model.nme"),
])
def test_cli_process_exits_2_without_traceback(tmp_path, argv, named):
  env = {**os.environ, "JAXDP_CPU_DEVICES": "2"}
  proc = subprocess.run([sys.executable, "-m", "jaxdp.train", *argv, "--workdir", str(tmp_path)],
                        capture_output=True, text=True, env=env, timeout=120)
  assert proc.returncode == 2, proc.stderr
  assert "Traceback" not in proc.stderr
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and named in errors[0], proc.stderr


def test_failing_command_prints_exactly_one_line_on_stderr(tmp_path):
  """No TensorFlow/absl start-up lines around the error (TensorFlow is imported before the error)."""
  env = {**os.environ, "JAXDP_CPU_DEVICES": "2"}
  for key in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS"):
    env.pop(key, None)  # As a user's shell has it: tests/conftest.py sets one of them.
  proc = subprocess.run([sys.executable, "-m", "jaxdp.train", "--config", CONFIG, "--workdir", str(tmp_path),
                         "--config.batch_sise=1"], capture_output=True, text=True, env=env, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.splitlines() == ["error: unknown config key 'config.batch_sise' (did you mean 'batch_size'?)"]


@pytest.mark.parametrize("flag", ["--help", "-h", "--helpfull"])
def test_help_prints_the_flags_and_exits_0(capsys, flag):
  with pytest.raises(SystemExit) as exit_:
    train.main(["jaxdp.train", flag])
  out = capsys.readouterr().out
  assert exit_.value.code == 0
  assert out.startswith("usage: python -m jaxdp.train")
  assert all(f"--{name}:" in out for name in ("config", "workdir", "cpu_devices", "config.KEY=VALUE"))


@pytest.mark.parametrize("program", ["/site-packages/jaxdp/evaluate.py", "jaxdp.evaluate"])
def test_help_names_the_module_it_was_run_as(capsys, program):
  with pytest.raises(SystemExit):
    cli.start([program, "--help"])
  assert capsys.readouterr().out.startswith("usage: python -m jaxdp.evaluate --config CONFIG.py [flags]\n")


@pytest.mark.parametrize("source, why", [
    ("def get_config(:\n", "invalid syntax"),
    ("import no_such_module\n", "No module named 'no_such_module'"),
    ("def get_config():\n  raise ValueError('batch_size must be even')\n", "ValueError: batch_size must be even"),
    ("def get_config():\n  return open('/no/such/file')\n", "No such file or directory: '/no/such/file'"),
    ("def get_config():\n  pass\n", "get_config() returned None, not a ConfigDict"),
])
def test_a_broken_config_file_is_one_error_line_naming_it(tmp_path, capsys, source, why):
  broken = tmp_path / "broken.py"
  broken.write_text(source)
  status, err = _run(["--config", str(broken), "--workdir", str(tmp_path / "run")], capsys)
  assert status == 2 and err.startswith(f"error: could not load config file '{broken}': ") and "\n" not in err, err
  assert why in err


def test_a_failed_distributed_start_is_one_error_line(capsys):
  from jaxdp.runtime import distributed

  def start():
    raise distributed.DistributedInitError("process 1 of 2 found no coordinator at 10.0.0.1:1234 within 300 s")

  assert cli.guarded(start) == 1
  assert capsys.readouterr().err == "error: process 1 of 2 found no coordinator at 10.0.0.1:1234 within 300 s\n"


def test_help_of_the_shared_parser_names_the_tools_own_flags(capsys):
  with pytest.raises(SystemExit) as exit_:
    inspect_cli.main(["jaxdp.inspect", "--help"])
  assert exit_.value.code == 0
  out = capsys.readouterr().out
  assert out.startswith("usage: python -m jaxdp.inspect") and "--json:" in out and "--config:" in out


def test_plot_help_exits_0(capsys):
  for flag in ("--help", "--helpfull"):
    with pytest.raises(SystemExit) as exit_:
      plot.main([flag])
    assert exit_.value.code == 0 and "WORKDIR" in capsys.readouterr().out


def test_model_takes_new_keys_from_the_command_line():
  config, _ = cli.parse(["jaxdp.train", "--config", CONFIG, "--workdir", "w", "--config.model.dense=64",
                         "--config.model.features=(8, 16)", "--config.learning_rate=0.5"])
  assert config.model.dense == 64 and config.model.features == (8, 16)
  assert config.learning_rate == 0.5


def test_task_takes_new_keys_from_the_command_line():
  """A user task's keyword arguments (not declared by any config) come from flags, as a model's do."""
  config, _ = cli.parse(["jaxdp.train", "--config", CONFIG, "--workdir", "w", "--config.task.name=my_tasks:focal",
                         "--config.task.gamma=2.0", "--config.task.alpha=(1, 2)", "--config.task.mode=hard",
                         "--config.task.weights=gs://bucket/w.npy"])  # Not Python: a name, a syntax error.
  assert config.task.name == "my_tasks:focal"
  assert config.task.gamma == 2.0 and config.task.alpha == (1, 2) and config.task.mode == "hard"
  assert config.task.weights == "gs://bucket/w.npy"
  with pytest.raises(ConfigError, match=re.escape("unknown config key 'config.task.x.y'")):
    cli.parse(["jaxdp.train", "--config", CONFIG, "--workdir", "w", "--config.task.x.y=1"])


def test_a_model_taking_any_keyword_takes_new_keys(monkeypatch):
  from flax import nnx

  from jaxdp import models

  class Options(nnx.Module):
    def __init__(self, num_classes: int, *, rngs: nnx.Rngs, **options):
      pass

  monkeypatch.setattr(models, "resolve", lambda name: Options)
  config, _ = cli.parse(["jaxdp.train", "--config", CONFIG, "--workdir", "w", "--config.model.name=mine:Options",
                         "--config.model.depth=3"])
  assert config.model.depth == 3


@pytest.mark.parametrize("argv, error", [
    (["--config.model.dnse=64"], "unknown config key 'config.model.dnse': model 'cnn' takes no 'dnse' "
                                 "(did you mean 'dense'?)"),
    (["--config.model.name=mlp", "--config.model.dense=64"], "'config.model.dense': model 'mlp' takes no 'dense'"),
    (["--config.model.x.y=1"], "unknown config key 'config.model.x.y'"),
])
def test_new_model_keys_must_be_model_arguments(argv, error):
  with pytest.raises(ConfigError, match=re.escape(error)):
    cli.parse(["jaxdp.train", "--config", CONFIG, "--workdir", "w", *argv])


@pytest.mark.parametrize("key", ["gc_every_steps", "parallel.max_steps_in_flight", "distributed.process_id",
                                 "compilation_cache_dir", "momentum"])
def test_an_override_of_a_removed_key_says_it_was_removed(key):
  with pytest.raises(ConfigError, match=re.escape(f"config key {key!r} was removed (")):
    cli.parse(["jaxdp.train", "--config", CONFIG, "--workdir", "w", f"--config.{key}=1"])


def test_piped_output_gets_no_progress_bars(capsys):
  from tensorflow_datasets.core.utils import tqdm_utils
  try:
    process.setup_logging()  # Under capsys stdout is not a terminal.
    assert tqdm_utils._active is False
  finally:
    tqdm_utils.enable_progress_bar()


DEVICE_COUNTING_CONFIG = '''
import jax
from jaxdp.configs import default


def get_config():
  config = default.get_config()
  config.batch_size = 16 * jax.device_count()  # Asks JAX for its devices while the config loads.
  return config
'''


def test_cpu_devices_are_set_before_the_config_file_loads(tmp_path):
  (tmp_path / "per_device.py").write_text(DEVICE_COUNTING_CONFIG)
  code = ("import sys; from jaxdp.tools import cli; config, _ = cli.parse(sys.argv); import jax; "
          "print(config.batch_size, jax.device_count())")
  proc = subprocess.run([sys.executable, "-c", code, "--config", str(tmp_path / "per_device.py"), "--workdir", "w",
                         "--cpu_devices", "3"], capture_output=True, text=True, timeout=120,
                        env={k: v for k, v in os.environ.items() if k != "JAXDP_CPU_DEVICES"})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.split() == ["48", "3"]


@pytest.mark.parametrize("module", ["jaxdp.audit", "jaxdp.data.convert"])
def test_the_small_tools_print_help_and_one_error_line(module, capsys):
  main = importlib.import_module(module).main
  assert main([module, "--help"]) == 0 and "usage:" in capsys.readouterr().out
  assert main([module]) == 2
  assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, error", [
    (["--workdir"], "--workdir"),  # No value: one line, not argparse's usage and traceback.
    ([], "--workdir is required"),
    (["--workdir", "EMPTY"], "no checkpoint in workdir"),
])
def test_a_trained_workdirs_command_line_names_its_mistake(tmp_path, argv, error):
  argv = [str(tmp_path) if a == "EMPTY" else a for a in argv]
  with pytest.raises(ConfigError, match=re.escape(error)):
    cli.parse_workdir(["jaxdp.evaluate", *argv, "--config.seed=1"])


@pytest.fixture
def stored_token_file_run(monkeypatch):
  """A trained workdir's stored config, as `restore.stored_config` reads it: gpt_token_file's, eval_path unset."""
  from jaxdp.configs import gpt_token_file
  trained = gpt_token_file.get_config()
  trained.dataset.builder_kwargs.path = "train.bin"
  stored = json.loads(json.dumps(trained.to_dict()))  # As the checkpoint's metadata holds it.
  monkeypatch.setattr(restore, "stored_config", lambda workdir, step=None: restore.config_from(stored))


def test_a_stored_configs_unset_fields_take_overrides(stored_token_file_run):
  config, _ = cli.parse_workdir(["jaxdp.evaluate", "--workdir", "w", "--config.dataset.builder_kwargs.eval_path=val.bin",
                                 "--config.dataset.builder_kwargs.vocab_size=300", "--config.seed=3"])
  kwargs = config.dataset.builder_kwargs
  assert (kwargs.eval_path, kwargs.vocab_size, kwargs.path, config.seed) == ("val.bin", 300, "train.bin", 3)


@pytest.mark.parametrize("override, error", [
    ("--config.batch_size.x=1", "unknown config key 'config.batch_size.x'"),
    ("--config.model.name.x=1", "bad config override among --config.model.name.x"),
    ("--config.dataset.builder_kwargs.nokey=3", "unknown config key 'config.dataset.builder_kwargs.nokey'"),
])
def test_a_bad_override_of_a_stored_config_is_a_config_error(stored_token_file_run, override, error):
  with pytest.raises(ConfigError, match=re.escape(error) + ".* for the config stored in 'w'"):
    cli.parse_workdir(["jaxdp.evaluate", "--workdir", "w", override])


def test_own_flags_leave_the_shared_ones():
  import argparse
  parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
  parser.add_argument("--step", type=int)
  ours, rest = cli.own_flags(["jaxdp.x", "--workdir", "w", "--step=3", "--config.seed=1"], parser)
  assert ours.step == 3 and rest == ["jaxdp.x", "--workdir", "w", "--config.seed=1"]
  with pytest.raises(ConfigError, match="--step"):
    cli.own_flags(["jaxdp.x", "--step", "three"], parser)


def test_log_lines_go_to_the_stdout_of_the_moment_not_that_of_the_setup(monkeypatch, capsys):
  """A second command in the process, after stdout was replaced (a test's capture, a redirect), still logs."""
  first = io.StringIO()
  monkeypatch.setattr(sys, "stdout", first)
  try:
    process.setup_logging()
    first.close()  # The first command's stdout is gone (pytest closes its capture after each test).
    second = io.StringIO()
    monkeypatch.setattr(sys, "stdout", second)
    process.log.info("resumed from here")
    assert second.getvalue() == "resumed from here\n"
    assert "Logging error" not in capsys.readouterr().err
  finally:
    logging.root.handlers.clear()


def test_a_bad_value_of_a_workdir_tools_own_flag_is_one_error_line(capsys):
  from jaxdp.tools import evaluate
  assert evaluate.main(["jaxdp.evaluate", "--workdir", "w", "--step", "three"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and "--step" in err[0], err
