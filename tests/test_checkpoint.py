"""Checkpoints and faults: bitwise resume (SIGTERM, SIGKILL), torn saves, NaN skips, replica sentinel."""

import json
import os
import re
import signal
import time

import jax
import numpy as np
import pytest
import runs

from jaxdp import build, checkpoint, train
from jaxdp.loop import goodput
from jaxdp.config import ConfigError
from jaxdp.report import metrics
from jaxdp.strategies import zero1_layout as zero
from jaxdp.configs import default, mlp_digits

STEPS = 120
BASE = {"model.name": "mlp", "num_train_steps": STEPS, "log_every_steps": 1, "eval_every_steps": 60,
        "checkpoint_every_steps": 20}


def _config(data_dir, **overrides):
  return runs.config_with({"dataset.data_dir": data_dir, **BASE, **overrides})


def _cli(workdir, data_dir, base=default, **overrides):
  overrides = {"dataset.data_dir": data_dir, **BASE, **overrides}
  if base is not default:
    del overrides["model.name"]
  return runs.start("jaxdp.train", [*runs.flags(overrides, base), "--workdir", str(workdir)])


@pytest.fixture(scope="module")
def straight(data_dir, tmp_path_factory):
  """The uninterrupted run every interrupted one must end exactly like (per backend)."""
  done = {}
  for backend in ("mesh", "pmap"):
    workdir = tmp_path_factory.mktemp(f"straight_{backend}")
    done[backend] = (runs.host_state(train.train_and_evaluate(_config(data_dir, **{"parallel.backend": backend}),
                                                     str(workdir))), workdir)
  return done


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_stop_and_resume_is_bitwise(data_dir, tmp_path, straight, backend):
  first = _config(data_dir, num_train_steps=STEPS // 2, **{"parallel.backend": backend})
  train.train_and_evaluate(first, str(tmp_path))
  resumed = train.train_and_evaluate(_config(data_dir, **{"parallel.backend": backend}), str(tmp_path))
  expected, straight_dir = straight[backend]
  runs.assert_bitwise(runs.host_state(resumed), expected)
  assert runs.train_losses(tmp_path, STEPS // 2) == runs.train_losses(straight_dir, STEPS // 2)


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_sigterm_checkpoints_exits_0_and_resumes_bitwise(data_dir, tmp_path, straight, backend):
  proc = _cli(tmp_path, data_dir, num_train_steps=STEPS * 50, **{"parallel.backend": backend})
  runs.wait_for(lambda: os.path.exists(tmp_path / "metrics.jsonl") and len(runs.train_losses(tmp_path)) >= 30)
  sent = time.time()
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=30)
  assert proc.returncode == 0, out
  assert time.time() - sent < 30
  config = _config(data_dir, **{"parallel.backend": backend})
  with checkpoint.Checkpointer(str(tmp_path), config) as ckpt:
    stopped = ckpt.latest_step()
  assert 30 <= stopped < STEPS and "stop requested" in out  # Stopped within a few steps of the signal.
  resumed = train.train_and_evaluate(config, str(tmp_path))
  runs.assert_bitwise(runs.host_state(resumed), straight[backend][0])
  assert runs.train_losses(tmp_path, stopped) == runs.train_losses(straight[backend][1], stopped)


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_sigkill_after_a_checkpoint_resumes_bitwise(data_dir, tmp_path, straight, backend):
  proc = _cli(tmp_path, data_dir, num_train_steps=STEPS * 50, **{"parallel.backend": backend})
  runs.wait_for(lambda: (tmp_path / "checkpoints" / "40").is_dir())
  proc.kill()
  proc.communicate(timeout=30)
  config = _config(data_dir, **{"parallel.backend": backend})
  with checkpoint.Checkpointer(str(tmp_path), config) as ckpt:
    assert 40 <= ckpt.latest_step() < STEPS
  resumed = train.train_and_evaluate(config, str(tmp_path))
  runs.assert_bitwise(runs.host_state(resumed), straight[backend][0])


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_usable(data_dir, tmp_path):
  # A wide model makes each save take long enough to be killed in the middle of it.
  wide = {"model.hidden": "(1024,1024,1024)", "checkpoint_every_steps": 5}
  proc = _cli(tmp_path, data_dir, mlp_digits, num_train_steps=STEPS * 50, **wide)
  ckpts = tmp_path / "checkpoints"

  def saving_after_a_complete_one():
    names = os.listdir(ckpts) if ckpts.is_dir() else []
    return any(n.isdigit() for n in names) and any("tmp" in n for n in names)

  runs.wait_for(saving_after_a_complete_one, every=0.001)
  proc.kill()
  proc.communicate(timeout=30)
  torn = [n for n in os.listdir(ckpts) if "tmp" in n]
  assert torn, "the kill did not land during a save"
  config = _config(data_dir, num_train_steps=STEPS * 50)
  config.model.hidden = (1024, 1024, 1024)
  latest = checkpoint.Checkpointer(str(tmp_path), config).latest_step()
  config.num_train_steps = latest + 2
  result = train.train_and_evaluate(config, str(tmp_path))
  assert int(result.backend.get(result.state.step)) == latest + 2  # Restored from `latest`, trained on.


def test_a_checkpoint_that_does_not_fit_is_named_and_kept(data_dir, tmp_path, capsys):
  train.train_and_evaluate(_config(data_dir, num_train_steps=20), str(tmp_path))
  before = sorted(os.listdir(tmp_path / "checkpoints"))
  status = train.main(["jaxdp.train", "--config", default.__file__, "--workdir", str(tmp_path),
                       f"--config.dataset.data_dir={data_dir}", "--config.model.name=cnn"])
  err = capsys.readouterr().err.strip()
  assert status == 2 and err.startswith("error: checkpoint") and "params/" in err and len(err.splitlines()) == 1
  assert err.count(" is missing from the checkpoint") + err.count(" is in the checkpoint") <= 3
  assert re.search(r"\(and \d+ more\)", err), err  # Three differences named, the rest counted.
  assert sorted(os.listdir(tmp_path / "checkpoints")) == before


def test_a_checkpoint_of_other_shapes_names_each_difference_in_path_order(config, tmp_path):
  """Widths changed (two shapes) and a layer added (two paths): three named in path order, the fourth counted."""
  config.optimizer, config.num_train_steps, config.checkpoint_every_steps = "sgd", 2, 2
  train.train_and_evaluate(config, str(tmp_path))
  config.model.hidden = (64, 32)
  with pytest.raises(ConfigError) as e:
    train.train_and_evaluate(config, str(tmp_path))
  assert str(e.value) == (
      f"checkpoint {tmp_path}/checkpoints/2 does not fit the config: params/hidden/0/bias is float32[32] in the "
      "checkpoint, float32[64] in the config; params/hidden/0/kernel is float32[64, 32] in the checkpoint, "
      "float32[64, 64] in the config; params/hidden/1/bias is missing from the checkpoint (and 1 more) (use another "
      "--workdir; the checkpoint is left untouched)")
  assert checkpoint.steps(str(tmp_path)) == [2]


def test_keeps_the_newest_and_the_best(data_dir, tmp_path):
  config = _config(data_dir, num_train_steps=100, checkpoint_every_steps=10, eval_every_steps=10,
                   keep_checkpoints=2, keep_best_checkpoints=1, best_metric="eval/loss", best_mode="min")
  train.train_and_evaluate(config, str(tmp_path))
  kept = sorted(int(n) for n in os.listdir(tmp_path / "checkpoints") if n.isdigit())
  losses = {r["step"]: r["eval/loss"] for r in metrics.read(str(tmp_path)) if "eval/loss" in r}
  best = min(losses, key=losses.get)
  assert kept == sorted({90, 100, best})


def test_plain_optimizer_state_is_relaid_into_zero1(config, tmp_path):
  """A plain-DDP checkpoint (Adam's mu and nu in the parameters' shapes) resumed under ZeRO-1 (raveled, padded)."""
  config.optimizer, config.num_train_steps, config.checkpoint_every_steps = "adam", 2, 2
  saved = train.train_and_evaluate(config, str(tmp_path))
  stored = saved.backend.get(saved.state.opt_state)[0]
  params = saved.backend.get(saved.state.params)
  config.parallel.num_devices, config.parallel.shard_optimizer_state = 8, True
  parts = build.build(config)
  with checkpoint.Checkpointer(str(tmp_path), config) as ckpt:
    restored = ckpt.restore_or_init(parts.backend, parts.init)
  relaid = restored.opt_state[0]
  for moment in ("mu", "nu"):
    before, after = getattr(stored, moment), jax.tree.map(np.asarray, getattr(relaid, moment))
    assert all(np.any(x != 0) for x in jax.tree.leaves(before))  # Two Adam steps: the moments moved.
    assert all(x.ndim == 1 and x.size % 8 == 0 for x in jax.tree.leaves(after))  # ZeRO-1's layout.
    runs.assert_bitwise(zero.unflatten(after, params), before)
  assert all(x.sharding.spec == jax.sharding.PartitionSpec("data") for x in jax.tree.leaves(relaid.mu))
  config.num_train_steps = 4
  result = train.train_and_evaluate(config, str(tmp_path))  # Resumes at step 2 and trains on under ZeRO-1.
  assert int(result.backend.get(result.state.step)) == 4


def test_an_older_checkpoint_with_a_data_position_still_resumes(data_dir, tmp_path):
  """Older jaxdp wrote a `data_position` beside each state; none is written now, and such an entry resumes."""
  config = _config(data_dir, num_train_steps=4, checkpoint_every_steps=2, eval_every_steps=1000, log_every_steps=2)
  train.train_and_evaluate(config, str(tmp_path))
  meta_file = tmp_path / "checkpoints" / "4" / "meta" / "metadata"
  meta = json.loads(meta_file.read_text())
  assert "data_position" not in meta and meta["step"] == 4
  meta["data_position"] = {"global_batches_consumed": 4, "seed": config.seed, "batch_size": config.batch_size}
  meta_file.write_text(json.dumps(meta))
  config.num_train_steps = 6
  result = train.train_and_evaluate(config, str(tmp_path))
  assert int(result.backend.get(result.state.step)) == 6


def test_a_workdir_names_its_checkpoints_in_one_message(tmp_path):
  """checkpoint.steps / pick_step: the newest by default; a missing step names the steps there are."""
  assert checkpoint.steps(str(tmp_path)) == []
  with pytest.raises(ConfigError, match="no checkpoint in workdir"):
    checkpoint.pick_step(str(tmp_path))
  # Steps in numeric order, whatever order the directory lists them in; a save cut off by a kill is never listed.
  for name in ("10", "2", "100", "9", "30", "12.orbax-checkpoint-tmp-1"):
    (tmp_path / "checkpoints" / name).mkdir(parents=True)
  assert checkpoint.steps(str(tmp_path)) == [2, 9, 10, 30, 100]
  assert checkpoint.pick_step(str(tmp_path)) == 100 and checkpoint.pick_step(str(tmp_path), 2) == 2
  with pytest.raises(ConfigError, match=r"^no checkpoint 3 in .*/checkpoints \(have: \[2, 9, 10, 30, 100\]\)$"):
    checkpoint.pick_step(str(tmp_path), 3)


def test_saving_a_step_already_saved_is_a_no_op(config, tmp_path):
  """A stop right after a periodic save (or a notebook) may save a step twice; orbax alone would raise."""
  config.num_train_steps = config.checkpoint_every_steps = 2
  result = train.train_and_evaluate(config, str(tmp_path))
  with checkpoint.Checkpointer(str(tmp_path), config) as saver:
    saver.save(2, result.state, result.backend)
  assert checkpoint.steps(str(tmp_path)) == [2]


def test_saving_a_replicated_state_makes_no_program(config, tmp_path):
  """orbax writes a replicated array in a slice per device, each slice a program made for its shape; jaxdp hands it
  one device's copy per process instead (what is written is the same: the resume tests hold its bits)."""
  config.num_train_steps = 2
  result = train.train_and_evaluate(config, str(tmp_path))
  leaves = jax.tree.leaves(result.state)
  assert result.backend.num_devices == 8 and all(x.sharding.is_fully_replicated for x in leaves), leaves
  with checkpoint.Checkpointer(str(tmp_path), config) as saver, goodput.CompileWatch() as made:
    saver.save(3, result.state, result.backend)
    saver.wait()
  assert checkpoint.steps(str(tmp_path))[-1] == 3 and made.programs == 0, made.describe()
