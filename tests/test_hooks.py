"""`train_and_evaluate(..., hooks=[...])`: what hooks see and when, a stop agreed by every process, a raising hook,
and Weights & Biases offline holding what metrics.jsonl holds."""

import glob
import hashlib
import json
import os
import struct
import subprocess
import sys

import jax
import numpy as np
import pytest
import runs
from jax.experimental import multihost_utils

import jaxdp
from jaxdp import checkpoint, train
from jaxdp.loop import hooks
from jaxdp.report import metrics
from jaxdp.tools import cli

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_two_processes_stop_early_at_the_same_step_with_a_checkpoint_there(data_dir, tmp_path):
  proc = subprocess.run([sys.executable, "-m", "jaxdp.launch", "--num_processes", "2", "--devices_per_process", "1",
                         "--", os.path.join(TESTS, "hook_train.py"), str(tmp_path), data_dir],
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
  seen = [json.loads((tmp_path / f"hooks_{p}.json").read_text()) for p in (0, 1)]
  assert [s["stopped_at"] for s in seen] == [6, 6]
  assert checkpoint.steps(str(tmp_path)) == [6]  # Checkpointing is off: the stop saved it.
  assert "EarlyStopping asked to stop; checkpoint saved (stopped at step 6)" in proc.stdout
  assert [s["steps"] for s in seen] == [[3, 6], [3, 6]]  # every=3 on each process, to the stop.
  evals = {str(r["step"]): {k: v for k, v in r.items() if k.startswith("eval/")}
           for r in metrics.read(str(tmp_path)) if "eval/loss" in r}
  assert seen[0]["evals"] == seen[1]["evals"] == evals and list(evals) == ["2", "4", "6"]


def test_a_hook_sees_the_eval_and_train_metrics_metrics_jsonl_holds_and_every_n_at_its_multiples(config, tmp_path):
  seen = {"on_eval": {}, "on_log": {}, "on_step": [], "on_checkpoint": []}

  class Recorder(jaxdp.Hook):
    every = 3

    def on_log(self, info):
      seen["on_log"][info.step] = dict(info.metrics)

    def on_eval(self, info):
      seen["on_eval"][info.step] = dict(info.metrics)
      assert info.workdir == str(tmp_path) and int(info.state.step.addressable_data(0)) == info.step
      params = info.params  # One host copy.
      assert jax.tree.structure(params) == jax.tree.structure(info.state.params)
      assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves(params))

    def on_step(self, info):
      seen["on_step"].append(info.step)

    def on_checkpoint(self, info):
      seen["on_checkpoint"].append(info.step)

  config.num_train_steps, config.eval_every_steps, config.checkpoint_every_steps = 10, 4, 5
  result = train.train_and_evaluate(config, str(tmp_path), hooks=[Recorder()])
  assert result.stopped_at is None and seen["on_step"] == [3, 6, 9] and seen["on_checkpoint"] == [5, 10]
  records = metrics.read(str(tmp_path))
  for event, prefix in (("on_eval", "eval/"), ("on_log", "train/")):
    logged = {r["step"]: {k: v for k, v in r.items() if k.startswith(prefix)} for r in records
              if any(k.startswith(prefix) for k in r)}
    assert seen[event] == logged and logged, event
  assert list(seen["on_eval"]) == [4, 8, 10] and list(seen["on_log"]) == [2, 4, 6, 8, 10]


def test_a_function_hook_every_n_steps_can_stop_the_run(config, tmp_path):
  steps = []

  def stop_at_six(info):
    steps.append(info.step)
    return jaxdp.STOP if info.step == 6 else None

  config.num_train_steps = 20
  result = train.train_and_evaluate(config, str(tmp_path), hooks=[jaxdp.hook(stop_at_six, every=2)])
  assert steps == [2, 4, 6] and result.stopped_at == 6 and not result.preempted
  assert checkpoint.steps(str(tmp_path)) == [6]
  assert int(result.backend.get(result.state.step)) == 6


def test_a_stop_asked_on_any_process_stops_every_one(monkeypatch):
  """The OR across processes, at the steps a hook ran (the all-gather is collective: never elsewhere)."""
  gathered = []

  def allgather(flags):
    gathered.append(int(flags[0]))
    return np.array([[int(flags[0])], [1]])  # The other process asked to stop.

  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
  group = hooks.Hooks([hooks.hook(lambda info: None, every=2)], "/unused")
  assert not group.should_stop(1, None) and gathered == []  # No hook ran at step 1: no collective.
  assert group.should_stop(2, None) and gathered == [0]


def test_early_stopping_counts_evals_without_improvement():
  stopping = jaxdp.EarlyStopping("eval/accuracy", mode="max", patience=2, min_delta=0.01)
  decisions = [stopping.on_eval(jaxdp.StepInfo(s, {"eval/accuracy": a}, None, "")) for s, a in
               enumerate([0.5, 0.6, 0.605, 0.7, 0.7, float("nan")])]
  assert decisions == [None, None, None, None, None, jaxdp.STOP]
  with pytest.raises(jaxdp.ConfigError, match="mode='up'"):
    jaxdp.EarlyStopping(mode="up")


def _files(workdir) -> dict[str, str]:
  """Every file of every completed checkpoint: path -> sha256."""
  out = {}
  for step in checkpoint.steps(str(workdir)):
    for path in glob.glob(os.path.join(checkpoint.directory(str(workdir)), str(step), "**"), recursive=True):
      if os.path.isfile(path):
        out[path] = hashlib.sha256(open(path, "rb").read()).hexdigest()
  return out


@pytest.mark.parametrize("event", ["on_step", "on_checkpoint"])
def test_a_raising_hook_is_one_error_line_naming_it_and_every_checkpoint_stays(config, tmp_path, capsys, event):
  """Raising at step 5 (on_step) or in the checkpoint of step 4: the checkpoints completed by then are untouched."""
  before, calls = {}, []

  class Exploding(jaxdp.Hook):
    every = 5

    def explode(self, info):
      calls.append(info.step)
      before.update(_files(tmp_path))
      raise RuntimeError("boom\nsecond line")

  if event == "on_step":
    Exploding.on_step = Exploding.explode
  else:
    Exploding.on_checkpoint = lambda self, info: self.explode(info) if info.step == 4 else None
  config.num_train_steps, config.checkpoint_every_steps, config.keep_checkpoints = 8, 2, 10
  status = cli.guarded(lambda: train.train_and_evaluate(config, str(tmp_path), hooks=[Exploding()]))
  err = capsys.readouterr().err
  step = 5 if event == "on_step" else 4
  assert status == 2 and err == f"error: hook Exploding failed in {event} at step {step}: RuntimeError: boom\n"
  assert calls == [step]  # The error path's save is not a second checkpoint of the step (nor a second call).
  after = _files(tmp_path)
  assert {p: h for p, h in after.items() if p in before} == before and before
  # The error path saves the step it stopped at (one process, as after any error), never one already saved.
  assert checkpoint.steps(str(tmp_path)) == [2, 4, 5] if event == "on_step" else [2, 4]
  with pytest.raises(jaxdp.HookError, match=f"hook Exploding failed in {event}") as raised:
    train.train_and_evaluate(config, str(tmp_path / "python"), hooks=[Exploding()])
  assert isinstance(raised.value.__cause__, RuntimeError)


def test_a_hook_that_is_not_one_is_refused_before_the_run(config, tmp_path):
  with pytest.raises(jaxdp.ConfigError, match=r"is not a jaxdp.Hook \(make one of a function with jaxdp.hook"):
    train.train_and_evaluate(config, str(tmp_path), hooks=[print])
  assert not os.path.exists(tmp_path / "metrics.jsonl")


def _wandb_history(wandb_dir) -> dict[int, dict]:
  """step -> the scalars an offline W&B run logged at it, read from its run-ID.wandb file.

  The file is a LevelDB log (wandb's transaction log, which `wandb sync` uploads): a 7-byte header, then 32 KiB
  blocks of chunks (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) holding protobuf Records. wandb no
  longer ships a Python reader (it moved to its Go core), so the test reads the format itself.
  """
  from wandb.proto import wandb_internal_pb2
  history: dict[int, dict] = {}
  for path in sorted(glob.glob(os.path.join(str(wandb_dir), "wandb", "offline-run-*", "run-*.wandb"))):
    raw = open(path, "rb").read()
    assert raw[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(raw):
      if 32768 - pos % 32768 < 7:  # A block's tail too short for a header is padding.
        pos += 32768 - pos % 32768
        continue
      _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
      if pos + 7 + length > len(raw):  # A chunk W&B is still writing.
        break
      pending, pos = pending + raw[pos + 7:pos + 7 + length], pos + 7 + length
      if kind in (1, 4):
        record = wandb_internal_pb2.Record.FromString(pending)
        pending = b""
        if record.WhichOneof("record_type") == "history":
          # A key with "/" is stored as its parts (`nested_key`).
          row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
          history.setdefault(int(record.history.step.num), {}).update(row)
  return history


def test_wandb_offline_holds_every_train_and_eval_record_and_a_restart_resumes_its_run(config, tmp_path, monkeypatch):
  pytest.importorskip("wandb")
  for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path / "wandb")}.items():
    monkeypatch.setenv(name, value)
  os.makedirs(tmp_path / "wandb")
  workdir = str(tmp_path / "run")
  config.eval_every_steps, config.checkpoint_every_steps = 2, 4
  train.train_and_evaluate(config, workdir, hooks=[jaxdp.WandbTracker(project="jaxdp-test", mode="offline")])
  run_id = open(os.path.join(workdir, "wandb_run_id")).read()
  runs.override(config, {"num_train_steps": 6})
  train.train_and_evaluate(config, workdir, hooks=[jaxdp.WandbTracker(project="jaxdp-test", mode="offline")])
  offline = glob.glob(str(tmp_path / "wandb" / "wandb" / "offline-run-*"))
  assert len(offline) == 2 and all(path.endswith(f"-{run_id}") for path in offline)  # The restart resumed it.
  logged = {(r["step"], k): v for r in metrics.read(workdir) for k, v in r.items() if k.startswith(("train/", "eval/"))}
  assert {s for s, _ in logged} == {2, 4, 6}
  # W&B's service may still be writing the run's last records when `finish()` returns: wait until every logged key
  # is there (a missing one times out), then compare the values.
  history: dict[int, dict] = {}

  def arrived() -> bool:
    history.update(_wandb_history(tmp_path / "wandb"))
    return all(key in history.get(step, {}) for step, key in logged)
  runs.wait_for(arrived, timeout=120, every=0.1)
  assert {key: history.get(key[0], {}).get(key[1]) for key in logged} == pytest.approx(logged, rel=1e-12)
