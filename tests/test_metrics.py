"""Metric writers: metrics.jsonl and TensorBoard hold the same scalars, written by process 0 only."""

import jax
import numpy as np
import pytest
import runs

from jaxdp.loop import hooks
from jaxdp.report import metrics
from jaxdp import train

CONTRACT = {"train/loss", "train/accuracy", "eval/loss", "eval/accuracy", "eval/num_examples"}
PERF = {"perf/step_time", "perf/examples_per_second", "perf/examples_per_second_per_device"}


def test_tensorboard_files_hold_every_scalar_of_metrics_jsonl(config, tmp_path):
  config.num_train_steps, config.log_every_steps, config.eval_every_steps = 4, 2, 4
  config.checkpoint_every_steps = 0  # Not what this test is about.
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir)
  jsonl = {(key, r["step"]): value for r in metrics.read(workdir) for key, value in r.items()
           if key != "step" and type(value) in (int, float)}  # Text (data/digest) is not a scalar.
  events = runs.read_tensorboard(workdir)
  tensorboard = {(tag, step): value for tag, points in events.items() for step, value in points}
  assert tensorboard.keys() == jsonl.keys()
  for key, value in jsonl.items():
    assert tensorboard[key] == pytest.approx(value, rel=1e-6), key  # Event files hold float32.
  assert CONTRACT | PERF <= set(events)
  assert "perf/mfu" not in events  # No known peak FLOP/s on CPU.
  assert [step for step, _ in events["train/loss"]] == [2, 4]
  throughput = dict(events["perf/examples_per_second"])[4]
  per_device = dict(events["perf/examples_per_second_per_device"])[4]
  assert throughput == pytest.approx(config.batch_size / dict(events["perf/step_time"])[4], rel=1e-5)
  assert per_device == pytest.approx(throughput / jax.device_count(), rel=1e-5)


def test_tensorboard_writes_numbers_only(tmp_path):
  writer = metrics.TensorBoardWriter(str(tmp_path))
  writer.on_write(3, {"a": 1.5, "b": np.float32(2.0), "c": 7, "name": "text", "flag": True, "vector": np.ones(2)})
  writer.close()
  assert runs.read_tensorboard(str(tmp_path)) == {"a": [(3, 1.5)], "b": [(3, 2.0)], "c": [(3, 7.0)]}


def test_writers_write_nothing_off_process_0(tmp_path, monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  writer = hooks.Hooks(metrics.trackers(str(tmp_path)), str(tmp_path))
  writer.write(1, {"train/loss": 1.0})
  writer.close()
  assert list(tmp_path.iterdir()) == []


def test_the_hooks_fan_each_record_out_to_every_tracker(tmp_path):
  seen = []

  class Recorder(hooks.Hook):
    def on_write(self, step, scalars):
      seen.append((step, dict(scalars)))

    def close(self):
      seen.append("closed")

  writer = hooks.Hooks([Recorder(), Recorder()], str(tmp_path))
  writer.write(5, {"train/loss": 0.5})
  writer.close()
  assert seen == [(5, {"train/loss": 0.5})] * 2 + ["closed"] * 2


def test_eval_sums_become_means_sums_maxima_with_the_loss_first_and_helpers_hidden():
  sums = {"mean": {"accuracy": np.float32(3.0), "loss": np.float32(6.0), "masked": np.float32(0.0)},
          "weight": {"accuracy": np.float32(4.0), "loss": np.float32(4.0), "masked": np.float32(0.0)},
          "sum": {"_tokens": np.float32(8.0)}, "max": {"worst": np.float32(2.5)}, "num_examples": np.int32(4)}

  class Task:
    def finalize(self, scalars):
      return {"per_token": scalars["loss"] / scalars["_tokens"]}  # Sees the helpers it derives from.

  out = metrics.summarize_eval(sums, Task())
  assert list(out)[0] == "eval/loss"  # First in the logs, whatever the task's order.
  assert np.isnan(out.pop("eval/masked"))  # No weight at all: undefined, never a plausible 0.
  assert out == {"eval/loss": 1.5, "eval/accuracy": 0.75, "eval/worst": 2.5, "eval/per_token": 1.5 / 8,
                 "eval/num_examples": 4}
  assert type(out["eval/num_examples"]) is int


def test_metrics_jsonl_holds_numpy_scalars_as_numbers(tmp_path):
  writer = metrics.JsonlWriter(str(tmp_path))
  writer.on_write(np.int64(2), {"a": np.float32(1.5), "b": np.int32(3), "c": np.array(0.25), "d": "text"})
  assert metrics.read(str(tmp_path)) == [{"step": 2, "a": 1.5, "b": 3, "c": 0.25, "d": "text"}]


def test_tensorboard_scalars_are_on_disk_before_the_writer_closes(tmp_path):
  writer = metrics.TensorBoardWriter(str(tmp_path))
  writer.on_write(1, {"train/loss": 2.0})  # A run killed now keeps what it logged.
  assert runs.read_tensorboard(str(tmp_path)) == {"train/loss": [(1, 2.0)]}
  writer.close()
