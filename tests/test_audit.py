"""Data-order audit: exactly-once per epoch across resumes, replays caught, two runs compared (jaxdp.audit)."""

import collections
import os
import shutil

import numpy as np
import pytest

from jaxdp.loop import audit as recording
from jaxdp.tools import audit
from jaxdp.report import metrics
from jaxdp import feed, train
from jaxdp.data import order as sampler
from jaxdp.batch import INDEX

B = 256  # digits' train split has 1,437 examples: 5 steps per epoch.


@pytest.fixture
def audited(config):
  """The tiny config with a large batch (short epochs), recording the audit, checkpoints every 4 steps."""
  config.batch_size = B
  config.num_train_steps = 12
  config.audit_data = True
  config.checkpoint_every_steps = 4
  return config


def _train(config, workdir, steps, **changes):
  config = config.copy_and_resolve_references()
  config.num_train_steps = steps
  for key, value in changes.items():
    config[key] = value
  train.train_and_evaluate(config, str(workdir))


def _audit(*workdirs, capsys=None):
  if capsys:
    capsys.readouterr()  # Only the audit's own output.
  status = audit.main(["audit", *map(str, workdirs)])
  return status, capsys.readouterr().out if capsys else ""


def test_resume_mid_epoch_after_losing_steps_is_exactly_once(audited, tmp_path, capsys):
  _train(audited, tmp_path, 7)  # Checkpoints 4 and 7; step 7 is mid-epoch (5 steps per epoch).
  shutil.rmtree(tmp_path / "checkpoints" / "7")  # As if killed after step 7 before saving it: 5..7 are lost.
  _train(audited, tmp_path, 12)  # Resumes from 4, trains 5..12 again.
  status, out = _audit(tmp_path, capsys=capsys)
  assert status == 0, out
  assert "steps 1..12 in 2 segment(s)" in out and "2 completed epoch(s) of 5 steps" in out
  entries = audit.lineage(audit.load(str(tmp_path)))
  order = sampler.GlobalOrder(1437, B, audited.seed, "train")
  for i, entry in enumerate(entries):  # The recorded ids are the sampler's global batches, in order.
    np.testing.assert_array_equal(entry.ids, order.rows(i, 0, B))
  # The digests in metrics.jsonl name each logged step's global batch.
  digests = {r["step"]: r["data/digest"] for r in metrics.read(str(tmp_path)) if "data/digest" in r}
  assert digests and all(d == recording.batch_digest(entries[s - 1].ids) for s, d in digests.items())
  assert len(set(digests.values())) == len(digests)


def test_resume_that_replays_steps_is_caught(audited, tmp_path, capsys):
  _train(audited, tmp_path, 8)  # Checkpoints 4 and 8.
  ckpt = tmp_path / "checkpoints"
  shutil.rmtree(ckpt / "8")
  os.rename(ckpt / "4", ckpt / "8")  # A hand-edited checkpoint: named 8, holding step 4's state.
  _train(audited, tmp_path, 10)  # Resumes "from 8" at step 4: trains 5..10, replaying 5..8.
  status, out = _audit(tmp_path, capsys=capsys)
  assert status == 1
  assert "step 5 trained twice" in out and "resumed at step 4 from checkpoint 8" in out


def test_same_order_on_other_device_counts_and_another_seed_is_caught(audited, tmp_path, capsys):
  _train(audited, tmp_path / "eight", 3)
  _train(audited, tmp_path / "four", 4, parallel=dict(audited.parallel, num_devices=4))
  status, out = _audit(tmp_path / "eight", tmp_path / "four", capsys=capsys)
  assert status == 0, out
  assert "same global batches in the same order for steps 1..3" in out
  _train(audited, tmp_path / "seed", 2, seed=1)
  status, out = _audit(tmp_path / "eight", tmp_path / "seed", capsys=capsys)
  assert status == 1 and out.startswith("audit failed: step 1: the global batches differ"), out


def _segment(start, steps, restored=None, saves=(), batch=4, n=10, seed=0, process_count=1):
  """A synthetic segment whose global batches come from the sampler (n examples, batch 4: 2 steps/epoch)."""
  order = sampler.GlobalOrder(n, batch, seed, "train")
  header = {"segment": f"{start:020d}", "process_count": process_count, "num_devices": 1, "global_batch": batch,
            "num_examples": n, "steps_per_epoch": n // batch, "seed": seed, "split": "train", "dataset": "d",
            "start_step": start, "restored_from": restored}
  return audit.Segment(header, {s: order.rows(s - 1, 0, batch) for s in steps}, list(saves))


def test_lineage_drops_the_steps_a_lost_checkpoint_held():
  first = _segment(0, range(1, 6), saves=[2, 4])
  resumed = _segment(2, range(3, 8), restored=2)  # Checkpoint 4 lost: steps 3..5 retrained once.
  assert [e.step for e in audit.lineage([first, resumed])] == list(range(1, 8))


def test_a_duplicate_example_within_an_epoch_is_named():
  seg = _segment(0, range(1, 4))
  seg.steps[2] = seg.steps[2].copy()
  seg.steps[2][3] = seg.steps[1][0]  # The sampler gone wrong: one example twice in epoch 0.
  with pytest.raises(audit.AuditError, match=rf"step 2: example {seg.steps[1][0]} \(row 3\) was already trained on "
                     r"at step 1 of epoch 0"):
    audit.check_entries([seg], audit.lineage([seg]))


def test_skipped_steps_and_missing_records_are_named():
  first = _segment(0, range(1, 5), saves=[2])
  jumped = _segment(3, range(4, 6), restored=2)  # The state says 3, the checkpoint held 2: step 3 never trained.
  with pytest.raises(audit.AuditError, match="steps 3..3 were never trained"):
    audit.check_entries([first, jumped], audit.lineage([first, jumped]))
  unknown = _segment(4, range(5, 6), restored=4)
  with pytest.raises(audit.AuditError, match="resumed from checkpoint 4, which no audited segment saved"):
    audit.lineage([first, unknown])


def test_cli_errors(tmp_path, capsys):
  assert audit.main(["audit"]) == 2
  assert "error: expected one or two workdirs" in capsys.readouterr().err
  assert audit.main(["audit", str(tmp_path)]) == 2
  assert "no audit records" in capsys.readouterr().err


def test_a_duplicate_example_in_the_last_partial_epoch_is_named():
  seg = _segment(0, range(1, 6))  # 2 steps per epoch: step 5 alone in the partial epoch 2.
  seg.steps[5] = seg.steps[5].copy()
  seg.steps[5][2] = seg.steps[5][0]
  with pytest.raises(audit.AuditError, match=rf"step 5: example {seg.steps[5][0]} \(row 2\) was already trained on "
                     r"at step 5 of epoch 2"):
    audit.check_entries([seg], audit.lineage([seg]))


@pytest.mark.parametrize("order, process_count", [("global", 1), ("global", 2)])
def test_a_reader_that_reads_another_steps_rows_is_caught(order, process_count):
  """Ids that are a permutation's batches, but of the next step (`order.rows(step + 1)`): not the order's."""
  n, batch = 12, 4
  whole = sampler.GlobalOrder(n, batch, 0, "train")
  rows = lambda step: whole.rows(step, 0, batch)  # noqa: E731
  seg = _segment(0, (), batch=batch, n=n, process_count=process_count)
  seg.header["order"] = order
  seg.steps = {s: rows(s - 1) for s in range(1, 4)}
  audit.check_entries([seg], audit.lineage([seg]))  # The order's own batches pass.
  seg.steps = {s: rows(s) for s in range(1, 4)}  # Each step reads the next one's rows.
  with pytest.raises(audit.AuditError, match=rf"step 1: row 0 read example {rows(1)[0]}, but the {order} order of "
                     rf"seed 0 puts example {rows(0)[0]} there: the reader read other rows than its order names"):
    audit.check_entries([seg], audit.lineage([seg]))


def test_the_ids_recorded_are_those_read_and_the_step_never_sees_them(audited, tmp_path, monkeypatch):
  placed = []
  real_stack = feed.stack

  def stack(batches, steps):  # What goes to the devices, hence to the step.
    return real_stack((placed.append(sorted(b)) or b for b in batches), steps)

  monkeypatch.setattr(feed, "stack", stack)
  read = []
  real_take = feed._take_ids

  def take_ids(batches, on_ids):  # What the reader delivered, ids included.
    return real_take((read.append(b[INDEX].copy()) or b for b in batches), on_ids)

  monkeypatch.setattr(feed, "_take_ids", take_ids)
  _train(audited, tmp_path, 6)
  assert placed and all(keys == ["inputs", "labels"] for keys in placed)
  entries = audit.lineage(audit.load(str(tmp_path)))
  assert [e.step for e in entries] == list(range(1, 7))
  for entry, ids in zip(entries, read):
    np.testing.assert_array_equal(entry.ids, ids)
  assert "steps 1..6 in 1 segment(s)" in audit.check(str(tmp_path))  # The global order's batches, once per epoch.


def test_a_steps_ids_are_on_disk_once_recorded_and_a_step_without_ids_is_an_error(tmp_path):
  read = collections.deque()
  recorder = recording.Recorder({"segment": "0001", "process_index": 0}, str(tmp_path), read=read)
  batches = feed._take_ids(iter([{INDEX: np.array([5, 9]), "inputs": np.zeros(2)}]), read.append)
  assert INDEX not in next(batches)
  recorder.record(1)
  path = recording.stem(str(tmp_path), "0001", 0) + ".ids"
  np.testing.assert_array_equal(np.fromfile(path, recording.IDS_DTYPE), [1, 5, 9])  # Not closed: a kill keeps it.
  with pytest.raises(RuntimeError, match="step 2: no example ids were read for it"):
    recorder.record(2)
  recorder.close()
