"""Faults: a NaN on one device is skipped by every replica alike; the sentinel names a diverged replica."""

import functools
import os

import jax
import numpy as np
import pytest

from jaxdp import checkpoint, data, models, optim, parallel, train
from jaxdp.report import metrics
from jaxdp.loop import replicas, step_metrics
from jaxdp import step as step_lib


def _setup(config, backend_name):
  ds = data.load(config.dataset)
  model = models.get_model(config.model, ds.input_shape, ds.num_classes)
  tx = optim.make(config)
  backend = parallel.make_backend(backend_name)
  state = backend.init(functools.partial(step_lib.init_state, jax.random.PRNGKey(0), model=model, tx=tx))
  step = backend.map_train(functools.partial(step_lib.train_step, model=model, tx=tx))
  batch = next(data.train_batches(ds, "train", seed=0, global_batch=config.batch_size, start_step=0,
                                  process_index=0, process_count=1))
  return backend, state, step, batch


@pytest.mark.parametrize("backend_name", ["mesh", "pmap"])
def test_nan_on_one_device_is_skipped_by_all_replicas(config, backend_name):
  backend, state, step, batch = _setup(config, backend_name)
  before = backend.replicas(state)
  poisoned = dict(batch)
  per_device = config.batch_size // 8
  poisoned["inputs"] = batch["inputs"].copy()
  poisoned["inputs"][3 * per_device] = np.nan  # One example on device 3 only.
  state, m = step(state, backend.put_step(poisoned))
  assert int(backend.get(m)["nonfinite"]) == 1
  after = backend.replicas(state)
  jax.tree.map(np.testing.assert_array_equal, after.params, before.params)  # Skipped everywhere...
  jax.tree.map(np.testing.assert_array_equal, after.opt_state, before.opt_state)
  assert int(backend.get(state.step)) == 1  # ... while the batch counts as consumed.
  state, m = step(state, backend.put_step(batch))  # A clean batch trains again.
  assert int(backend.get(m)["nonfinite"]) == 0
  moved = backend.replicas(state.params)
  assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(moved), jax.tree.leaves(before.params)))
  for leaf in jax.tree.leaves(moved):
    assert all(np.array_equal(leaf[0], leaf[r]) for r in range(8))


def test_repeated_nans_stop_the_run_and_keep_the_last_good_checkpoint(config, tmp_path, capsys, monkeypatch):
  config.model = type(config.model)({"name": "user_models:PoisonNNX", "poison": False})
  config.num_train_steps, config.checkpoint_every_steps = 10, 10
  train.train_and_evaluate(config, str(tmp_path))
  saved = os.listdir(tmp_path / "checkpoints")
  config.model.poison = True
  config.num_train_steps = 30
  monkeypatch.setattr(step_metrics, "MAX_CONSECUTIVE_NONFINITE", 4)
  with pytest.raises(train.NonFiniteError, match="4 consecutive steps"):
    train.train_and_evaluate(config, str(tmp_path))
  assert os.listdir(tmp_path / "checkpoints") == saved
  records = metrics.read(str(tmp_path))
  assert any(r.get("train/nonfinite", 0) > 0 for r in records)  # The skips are counted.


def _planted(state, changes: dict):
  """`state.params` with device d's copy of a kernel (its values all different) replaced by `changes[d](it)`."""
  leaves = jax.tree.leaves(state.params)
  copies = [np.asarray(x.addressable_shards[0].data) for x in leaves]  # One device's copy (pmap: [1, ...]).
  k = next(i for i, c in enumerate(copies) if len(np.unique(c)) == c.size > 1)
  leaf = leaves[k]
  shards = [s.data for s in leaf.addressable_shards]
  for i, s in enumerate(leaf.addressable_shards):
    if s.device.id in changes:
      shards[i] = jax.device_put(changes[s.device.id](np.asarray(shards[i])), s.device)
  planted = jax.make_array_from_single_device_arrays(leaf.shape, leaf.sharding, shards)
  return jax.tree.unflatten(jax.tree.structure(state.params), [*leaves[:k], planted, *leaves[k + 1:]])


@pytest.mark.parametrize("backend_name", ["mesh", "pmap"])
def test_sentinel_names_the_diverged_replica(config, backend_name):
  backend, state, _, _ = _setup(config, backend_name)
  sentinel = replicas.Sentinel(backend)
  sentinel.check(state.params)  # Identical replicas pass.
  with pytest.raises(replicas.ReplicaMismatchError, match=r"device 5 \(process 0\)") as info:
    sentinel.check(_planted(state, {5: lambda x: x + np.float32(1e-7)}))
  assert "device 4" not in str(info.value) and "device 6" not in str(info.value)


def test_sentinel_sees_values_moved_within_a_replica_and_names_every_diverged_one(config):
  backend, state, _, _ = _setup(config, "mesh")
  sentinel = replicas.Sentinel(backend)
  swapped = lambda x: np.roll(x.reshape(-1), 1).reshape(x.shape)  # noqa: E731  Same bits, other places.
  with pytest.raises(replicas.ReplicaMismatchError, match=r"device 3 \(process 0\)"):
    sentinel.check(_planted(state, {3: swapped}))
  bumped = lambda x: x + np.float32(1e-7)  # noqa: E731
  with pytest.raises(replicas.ReplicaMismatchError, match=r"device 2 .*device 6 .*other 6 of 8"):
    sentinel.check(_planted(state, {2: bumped, 6: bumped}))


def _spy_checks_and_saves(monkeypatch) -> list:
  """Records, in order, "check" for each replica check and the step of each checkpoint save."""
  events, check, save = [], replicas.Sentinel.check, checkpoint.Checkpointer.save
  monkeypatch.setattr(replicas.Sentinel, "check",
                      lambda self, tree: events.append(("check", tree)) or check(self, tree))
  monkeypatch.setattr(checkpoint.Checkpointer, "save",
                      lambda self, step, *a, **k: events.append(("save", step)) or save(self, step, *a, **k))
  return events


def test_replicas_are_checked_right_before_each_checkpoint_save(config, tmp_path, monkeypatch):
  events = _spy_checks_and_saves(monkeypatch)
  config.num_train_steps, config.checkpoint_every_steps = 10, 4
  train.train_and_evaluate(config, str(tmp_path))
  assert [e[0] if e[0] == "check" else e[1] for e in events] == ["check", 4, "check", 8, "check", 10]


def test_without_checkpoints_the_replicas_are_checked_once_at_the_last_step(config, tmp_path, monkeypatch):
  events = _spy_checks_and_saves(monkeypatch)
  config.num_train_steps, config.checkpoint_every_steps = 6, 0
  result = train.train_and_evaluate(config, str(tmp_path))
  [(kind, checked)] = events
  assert kind == "check"
  for a, b in zip(jax.tree.leaves(checked), jax.tree.leaves(result.params)):  # The last step's parameters.
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
