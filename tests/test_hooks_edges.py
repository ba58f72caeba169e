"""Hooks and trackers at their edges: a plateau stops early stopping, the stop agreement runs only where a hook ran,
trackers get numbers and a failing one loses no record of metrics.jsonl, and a failed run leaves its workdir free."""

import pathlib
import re

import optax
import pytest

import jaxdp
from jaxdp import train
from jaxdp.loop import hooks
from jaxdp.report import metrics

HOOKS_MD = pathlib.Path(__file__).resolve().parent.parent / "docs" / "hooks.md"


def test_early_stopping_with_no_min_delta_stops_on_a_plateau_of_equal_values():
  """Seen failing with `<=` for `<` in `EarlyStopping.on_eval` (an equal value counted as an improvement)."""
  stopping = jaxdp.EarlyStopping("eval/loss", patience=3)
  decisions = [stopping.on_eval(jaxdp.StepInfo(s, {"eval/loss": 0.5}, None, "")) for s in range(4)]
  assert decisions == [None, None, None, jaxdp.STOP]


def test_the_stop_agreement_runs_only_at_the_steps_a_hook_ran(monkeypatch):
  """Seen failing with `self.ran = False` removed from `should_stop`: every step after the first hook agreed."""
  agreed = []
  monkeypatch.setattr(hooks, "any_process", lambda flag: agreed.append(flag) or flag)
  group = hooks.Hooks([hooks.hook(lambda info: None, on="eval"), hooks.hook(lambda info: None, every=4)], "/unused")
  for step in range(1, 13):
    if step % 5 == 0:
      group.call("on_eval", step, None, {"eval/loss": 1.0})
    assert not group.should_stop(step, None)
  assert agreed == [False] * 5  # Steps 4, 8, 12 (on_step) and 5, 10 (on_eval): not 1..3, 6, 7, 9, 11.


def _tracker_from_the_docs() -> type:
  """The `PrintTracker` docs/hooks.md shows (its `# print_tracker.py` block), as a user copies it."""
  block = re.search(r"```python\n(# print_tracker\.py\n.*?)```", HOOKS_MD.read_text(), re.S).group(1)
  namespace: dict = {}
  exec(compile(block, str(HOOKS_MD), "exec"), namespace)
  return namespace["PrintTracker"]


def test_a_tracker_written_from_the_docs_gets_numbers_and_metrics_jsonl_keeps_the_digest(config, tmp_path, capsys):
  """Seen failing with every tracker given the whole record: the docs' tracker formatted `data/digest` as a number
  (ValueError: Unknown format code 'g' for object of type 'str')."""
  seen = []

  class Numbers(jaxdp.Hook):
    def on_write(self, step, scalars):
      seen.extend(scalars.values())

  train.train_and_evaluate(config, str(tmp_path), hooks=[_tracker_from_the_docs()(), Numbers()])
  assert seen and all(metrics.is_number(v) for v in seen)
  assert "train/loss=" in capsys.readouterr().out
  assert all(isinstance(r["data/digest"], str) for r in metrics.read(str(tmp_path)) if "train/loss" in r)


def test_a_failing_uploader_loses_no_record_of_metrics_jsonl(config, tmp_path):
  """The default trackers run first. Seen failing with the user's trackers put before them (`run.hooks +
  metrics.trackers(...)` in loop/train.py): the record of step 2 never reached metrics.jsonl."""

  class Uploader(jaxdp.Hook):
    def on_write(self, step, scalars):
      if "train/loss" in scalars:
        raise ConnectionError("upload failed")

  with pytest.raises(hooks.HookError, match="hook Uploader failed in on_write at step 2: ConnectionError"):
    train.train_and_evaluate(config, str(tmp_path), hooks=[Uploader()])
  assert [r["step"] for r in metrics.read(str(tmp_path)) if "train/loss" in r] == [2]


def test_a_run_that_failed_in_this_process_leaves_its_workdir_free_for_the_next(config, tmp_path):
  """A notebook reruns after an error. Seen failing with the lock's close outside a `finally` (workdir_lock.hold):
  the second run was refused, "is in use by a live run (process 0 on host ..., pid <this one>)"."""

  def explode(info):
    raise RuntimeError("boom")

  with pytest.raises(hooks.HookError, match="boom"):
    train.train_and_evaluate(config, str(tmp_path), hooks=[jaxdp.hook(explode, every=3)])
  result = train.train_and_evaluate(config, str(tmp_path))
  assert int(result.backend.get(result.state.step)) == config.num_train_steps


def _logged_rates(workdir) -> dict[int, float]:
  return {r["step"]: r["train/learning_rate"] for r in metrics.read(str(workdir)) if "train/loss" in r}


def test_every_train_record_has_the_learning_rate_of_the_config_schedule(config, tmp_path):
  """Seen failing with `LearningRate.__call__` returning {}: no record had it."""
  config.num_train_steps, config.log_every_steps, config.lr_schedule, config.warmup_steps = 10, 2, "cosine", 3
  train.train_and_evaluate(config, str(tmp_path))
  schedule = optax.warmup_cosine_decay_schedule(0.0, config.learning_rate, 3, 10)
  expected = {step: float(schedule(step - 1)) for step in (2, 4, 6, 8, 10)}  # Update N reads count N - 1.
  assert _logged_rates(tmp_path) == pytest.approx(expected, rel=1e-6, abs=0)


def test_an_optax_object_whose_state_carries_the_rate_logs_it(config, tmp_path):
  """`optax.inject_hyperparams`: the rate read from the state's hyperparams at log steps. Seen failing with
  `injected_learning_rate` returning None: the records had no `train/learning_rate`."""
  schedule = optax.linear_schedule(0.1, 0.0, 10)
  optimizer = optax.inject_hyperparams(optax.sgd)(learning_rate=schedule, momentum=0.9)
  config.num_train_steps, config.log_every_steps = 10, 5
  train.train_and_evaluate(config, str(tmp_path), optimizer=optimizer)
  assert _logged_rates(tmp_path) == pytest.approx({5: float(schedule(4)), 10: float(schedule(9))}, rel=1e-6, abs=0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_start_summary_says_when_float16_loss_scaling_is_on(config, dtype):
  """Seen failing with the `precision` line left out of `summary.describe`: nothing said the loss was scaled."""
  from jaxdp import config as config_lib, data, models, parallel
  from jaxdp.report import summary
  config.dtype = dtype
  backend = parallel.make_backend("mesh")
  ds = data.load(config.dataset)
  lines = summary.describe(config, backend, config_lib.validate(config, backend.num_devices, 1), ds,
                           models.get_model(config.model, ds.input_shape, ds.num_classes))
  assert lines.get("precision", "").startswith("float16 compute under dynamic loss scaling") == (dtype == "float16")
