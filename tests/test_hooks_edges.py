"""Hooks and trackers at their edges: a plateau stops early stopping, the stop agreement runs only where a hook ran,
trackers get numbers and a failing one loses no record of metrics.jsonl, and a failed run leaves its workdir free."""

import pathlib
import re

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
