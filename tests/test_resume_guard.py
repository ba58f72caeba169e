"""Restoring checkpoints: the input-stream guard, elastic restarts (ZeRO-1 too), typed PRNG keys, cleanup."""

import hashlib
import logging
import os

import jax
import ml_collections
import numpy as np
import pytest
import runs

from jaxdp import build, checkpoint, train, zero
from jaxdp.config import ConfigError
from jaxdp.configs import mlp_digits


def _saving(config, steps=2):
  config.num_train_steps, config.checkpoint_every_steps = steps, steps
  return config


def _digest(directory) -> str:
  """One hash over every file's path and bytes under `directory`."""
  h = hashlib.sha256()
  for root, _, files in sorted(os.walk(directory)):
    for name in sorted(files):
      path = os.path.join(root, name)
      h.update(os.path.relpath(path, directory).encode())
      with open(path, "rb") as f:
        h.update(f.read())
  return h.hexdigest()


def test_a_changed_stream_is_named_in_one_line_and_the_checkpoint_is_untouched(config, tmp_path, capsys):
  train.train_and_evaluate(_saving(config), str(tmp_path))
  before = _digest(tmp_path / "checkpoints")
  status = train.main(["jaxdp.train", "--config", mlp_digits.__file__, "--workdir", str(tmp_path),
                       f"--config.dataset.data_dir={config.dataset.data_dir}", "--config.model.hidden=(32,)",
                       "--config.num_train_steps=4", "--config.seed=7",
                       "--config.batch_size=64"])
  err = capsys.readouterr().err.strip()
  assert status == 2 and len(err.splitlines()) == 1, err
  assert err.startswith("error: checkpoint") and "seed 0 -> 7" in err and "global_batch 32 -> 64" in err
  assert "new workdir" in err
  assert _digest(tmp_path / "checkpoints") == before


def test_the_same_stream_on_another_device_count_resumes(config, tmp_path):
  train.train_and_evaluate(_saving(config), str(tmp_path))
  config.num_train_steps, config.parallel.num_devices = 4, 4
  result = train.train_and_evaluate(config, str(tmp_path))
  assert int(result.backend.get(result.state.step)) == 4 and result.backend.num_devices == 4


def test_a_checkpoint_without_a_stored_stream_resumes_with_a_warning(config, tmp_path, caplog):
  parts = build.build(config)
  with checkpoint.Checkpointer(str(tmp_path), config) as old:  # No stream: as an older jaxdp wrote it.
    old.save(2, parts.backend.init(parts.init), parts.backend)
  config.num_train_steps = 4
  with caplog.at_level(logging.WARNING, logger="jaxdp"):
    result = train.train_and_evaluate(config, str(tmp_path))
  assert int(result.backend.get(result.state.step)) == 4
  assert "stores no input stream" in caplog.text


def test_a_failed_restore_closes_the_manager(config, tmp_path, monkeypatch):
  train.train_and_evaluate(_saving(config), str(tmp_path))
  config.seed = 3
  parts = build.build(config)
  ckpt = checkpoint.Checkpointer(str(tmp_path), config, stream={"seed": 3})
  closed = []
  monkeypatch.setattr(ckpt.manager, "close", lambda: closed.append(True))
  with pytest.raises(ConfigError, match="seed"):
    ckpt.restore_or_init(parts.backend, parts.init)
  assert closed == [True]


@pytest.mark.parametrize("devices", [4, 0])  # Elastic ZeRO-1 (8 -> 4), and ZeRO-1 -> plain data parallel.
def test_zero1_optimizer_state_is_relaid_for_another_layout(config, tmp_path, devices):
  config.parallel.shard_optimizer_state = True
  saved = train.train_and_evaluate(_saving(config), str(tmp_path))
  config.parallel.num_devices, config.parallel.shard_optimizer_state = devices, bool(devices)
  parts = build.build(config)
  with checkpoint.Checkpointer(str(tmp_path), config) as ckpt:
    restored = ckpt.restore_or_init(parts.backend, parts.init)
  params = jax.tree.map(np.asarray, saved.state.params)

  def as_params(opt_state):  # Each optimizer leaf that mirrors a parameter, in the parameter's shape.
    adam = jax.tree.map(np.asarray, opt_state[0])
    return [zero.unflatten(adam.mu, params), zero.unflatten(adam.nu, params), adam.count]

  runs.assert_bitwise(as_params(parts.backend.get(restored.opt_state) if not devices else restored.opt_state),
                      as_params(saved.state.opt_state))
  if devices:
    mu = jax.tree.leaves(restored.opt_state[0].mu)
    assert all(x.shape[0] % 4 == 0 and x.sharding.spec == jax.sharding.PartitionSpec("data") for x in mu)
  config.num_train_steps = 4
  result = train.train_and_evaluate(config, str(tmp_path))
  assert int(result.backend.get(result.state.step)) == 4


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_an_nnx_dropout_model_stops_and_resumes_bitwise(config, tmp_path, backend):
  config.model = ml_collections.ConfigDict({"name": "nnx_dropout:DropoutNNX"})
  config.parallel.backend = backend
  straight = train.train_and_evaluate(_saving(config, 4), str(tmp_path / "straight"))
  train.train_and_evaluate(_saving(config, 2), str(tmp_path / "resumed"))
  config.num_train_steps = 4
  resumed = train.train_and_evaluate(config, str(tmp_path / "resumed"))

  def host(result):  # Typed keys (the Rngs streams) compared by their key data.
    raw = jax.tree.map(lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
                       else x, result.state)
    return result.backend.get(raw)

  runs.assert_bitwise(host(resumed), host(straight))
