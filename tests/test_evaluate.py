"""`python -m jaxdp.evaluate`: a run's eval metrics reproduced exactly on any device count, from any checkpoint."""

import json

import pytest
import runs

from jaxdp.tools import evaluate, restore, sample
from jaxdp.report import metrics
from jaxdp import train


@pytest.fixture(scope="module")
def finished(data_dir, tmp_path_factory):
  """A short run that evaluates and checkpoints at its last step, with a non-default (stored) model width."""
  config = runs.config_with({"dataset.data_dir": data_dir, "model.name": "mlp", "batch_size": 32,
                             "num_train_steps": 4, "log_every_steps": 2, "eval_every_steps": 2,
                             "checkpoint_every_steps": 2, "eval_batch_size": 48})  # 360 test examples: the last batch is padded.
  # Plain data parallelism: eval sums the global batch's per-example values in one order for any device
  # count (a psum of per-device sums gave 2.29305030 on 4 devices for 2.29305013 on 8).
  with config.model.unlocked():
    config.model.hidden = (24,)  # Not in the config file: evaluate must take it from the checkpoint.
  with config.dataset.unlocked():
    del config.dataset["cache_mb"]  # As a config file of one's own may write it: not the default's "auto".
    config.dataset.cache_mb = 64
  workdir = tmp_path_factory.mktemp("finished")
  train.train_and_evaluate(config, str(workdir))
  evals = {r["step"]: r for r in metrics.read(str(workdir)) if "eval/loss" in r}
  return workdir, evals[4], evals[2]


@pytest.mark.parametrize("devices", [8, 4])
def test_reproduces_the_last_eval_metrics_exactly(finished, capsys, devices):
  workdir, last, _ = finished
  status = evaluate.main(["jaxdp.evaluate", "--workdir", str(workdir), f"--config.parallel.num_devices={devices}"])
  out = capsys.readouterr().out.strip().splitlines()
  assert status == 0
  record = json.loads(out[-1])
  assert record["step"] == 4 and any("checkpoint" in line and line.endswith("/4 on test") for line in out), out
  for key in ("eval/loss", "eval/accuracy", "eval/num_examples"):
    assert record[key] == last[key], key
  assert record["eval/num_examples"] == 360


def test_the_stored_config_comes_back_with_the_runs_own_types(finished):
  """A model's keyword arguments as the config files write them (tuples, not JSON's lists); a value of another type
  than the default's as the run had it."""
  stored = restore.stored_config(str(finished[0]))
  assert type(stored.model.hidden) is tuple and stored.model.hidden == (24,)
  assert type(stored.dataset.cache_mb) is int and stored.dataset.cache_mb == 64


def _results(workdir) -> list[dict]:
  """The records of WORKDIR/evaluate.jsonl, oldest first."""
  path = workdir / evaluate.RESULTS_FILE
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_an_older_step_is_the_one_evaluated_and_its_record_appended(finished, capsys):
  workdir, _, second = finished
  before = _results(workdir)
  assert evaluate.main(["jaxdp.evaluate", "--workdir", str(workdir), "--step", "2"]) == 0
  record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert (record["step"], record["split"], record["eval/loss"]) == (2, "test", second["eval/loss"]), (record, second)
  assert _results(workdir) == before + [record]


def test_another_split_is_evaluated_whole(finished, capsys):
  assert evaluate.main(["jaxdp.evaluate", "--workdir", str(finished[0]), "--split", "train"]) == 0
  record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert (record["split"], record["eval/num_examples"]) == ("train", 1797 - 360)


def test_a_missing_step_is_one_line(finished, capsys):
  status = evaluate.main(["jaxdp.evaluate", "--workdir", str(finished[0]), "--step", "3"])
  err = capsys.readouterr().err.strip()
  assert status == 2 and len(err.splitlines()) == 1 and "no checkpoint 3" in err, err


def test_help_prints_the_flags_and_exits_0(capsys):
  with pytest.raises(SystemExit) as info:
    evaluate.main(["jaxdp.evaluate", "--help"])
  out = capsys.readouterr().out
  assert info.value.code == 0 and "--workdir" in out and "--step" in out and "--split" in out


def test_sample_restores_a_zero1_checkpoint_from_its_stored_config(data_dir, tmp_path):
  config = runs.config_with({"dataset.data_dir": data_dir, "model.name": "mlp", "batch_size": 32,
                             "num_train_steps": 2, "eval_every_steps": 1000, "checkpoint_every_steps": 2,
                             "parallel.shard_optimizer_state": True})
  result = train.train_and_evaluate(config, str(tmp_path))
  _, params, _, _ = sample.load_model(restore.stored_config(str(tmp_path)), str(tmp_path))
  runs.assert_bitwise(params, result.backend.get(result.state.params))


def test_sampling_a_checkpoint_that_is_no_language_model_is_one_error_line(finished, capsys):
  workdir = finished[0]  # An MLP on digits: no text to continue (was an IndexError's 31-line traceback).
  status = sample.main(["jaxdp.sample", "--workdir", str(workdir), "--num_chars", "4"])
  err = capsys.readouterr().err
  errors = [line for line in err.splitlines() if line.startswith("error:")]
  assert status == 2, err[-2000:]
  assert len(errors) == 1 and "'mlp'" in errors[0] and "not a byte-level language model" in errors[0], err[-2000:]
  assert "Traceback" not in err, err[-2000:]
