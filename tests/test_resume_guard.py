"""Restoring checkpoints: the input-stream guard, elastic restarts (ZeRO-1 too), typed PRNG keys, cleanup."""

import dataclasses
import hashlib
import os
import re
import types

import jax
import ml_collections
import numpy as np
import pytest
import runs

from jaxdp import build, checkpoint, data, train
from jaxdp.datasets import digits  # noqa: F401  (defining its builder registers "digits" with TFDS)
from jaxdp.strategies import zero1_layout as zero
from jaxdp.config import ConfigError
from jaxdp.data import preprocess as images
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


def test_a_checkpoint_without_a_stored_stream_is_refused_in_one_line(config, tmp_path):
  parts = build.build(config)
  with checkpoint.Checkpointer(str(tmp_path), config) as old:  # No stream: as an older jaxdp wrote it.
    old.save(2, parts.backend.init(parts.init), parts.backend)
  before = _digest(tmp_path / "checkpoints")  # The run's lock file (WORKDIR/jaxdp.lock) is new beside them.
  config.num_train_steps = 4
  with pytest.raises(ConfigError, match=r"checkpoint .*/2: the checkpoint's input stream is of jaxdp's order "
                                        r"version 1, this jaxdp reads version \d+.*\(the checkpoint is left untouched\)"):
    train.train_and_evaluate(config, str(tmp_path))
  assert _digest(tmp_path / "checkpoints") == before


def test_a_failed_restore_closes_the_manager(config, tmp_path, monkeypatch):
  train.train_and_evaluate(_saving(config), str(tmp_path))
  config.model.hidden = (16,)  # A checkpoint that does not fit.
  parts = build.build(config)
  ckpt = checkpoint.Checkpointer(str(tmp_path), config)
  closed = []
  monkeypatch.setattr(ckpt.manager, "close", lambda: closed.append(True))
  with pytest.raises(ConfigError, match="does not fit"):
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


# ------------------------------------------------------------------------------- what the stream spec guards


def _spec(ds, split="train", **kw):
  return data.stream_spec(ds, split, **{"seed": 0, "global_batch": 32, **kw})


def _with(ds, corpus_name=None, **preprocess):
  """`ds` with other preprocessing fields, or another dataset name / version."""
  options = dataclasses.replace(ds.options, preprocess=dataclasses.replace(ds.options.preprocess, **preprocess))
  corpus = ds.corpus if corpus_name is None else types.SimpleNamespace(
      facts=dataclasses.replace(ds.corpus.facts, name=corpus_name))
  return dataclasses.replace(ds, corpus=corpus, options=options)


@pytest.mark.parametrize("change, key", [
    (lambda ds: _spec(ds, "train[:90%]"), "split 'train' -> 'train[:90%]'"),
    (lambda ds: _spec(_with(ds, flip=True)), "flip False -> True"),
    (lambda ds: _spec(_with(ds, crop_padding=2)), "crop_padding 0 -> 2"),
    (lambda ds: _spec(_with(ds, "digits/9.9.9")), "dataset 'digits/1.1.0' -> 'digits/9.9.9'"),
    (lambda ds: _spec(_with(ds, "other/1.1.0")), "dataset 'digits/1.1.0' -> 'other/1.1.0'"),
    (lambda ds: _spec(_with(ds, image_size=32)), "image_size 0 -> 32"),
    (lambda ds: _spec(ds, seed=1), "seed 0 -> 1"),
], ids=["split", "flip", "crop_padding", "version", "name", "image_size", "seed"])
def test_each_fact_the_batches_depend_on_is_refused_when_it_changes(data_dir, change, key):
  ds = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir}))
  assert ds.corpus.facts.name == "digits/1.1.0"  # The name and its version.
  with pytest.raises(ConfigError, match=re.escape(key)):
    data.check_resume(_spec(ds), change(ds))


def test_another_crop_recipe_is_refused(data_dir, monkeypatch):
  ds = _with(data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir})), image_size=32)
  saved = _spec(ds)
  monkeypatch.setattr(images, "RECIPE", images.RECIPE + " (changed)")
  with pytest.raises(ConfigError, match=r"crop 'inception-crop.*bicubic' -> 'inception-crop.*\(changed\)'"):
    data.check_resume(saved, _spec(ds))


def _old(**changes) -> dict:
  """A digits spec as jaxdp wrote it before the spec named its order's version (global batch 32)."""
  spec = {"dataset": "digits/1.1.0", "source": "tfds-array_record", "order": "global", "split": "train", "seed": 0,
          "global_batch": 32, "features": ["inputs", "labels"], "crop_padding": 0, "flip": False, "image_size": 0}
  return {**spec, **changes}


def test_a_spec_of_another_order_version_is_refused_in_one_line(data_dir):
  ds = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir}))
  current = _spec(ds)
  assert {k: v for k, v in current.items() if k != "version"} == _old()  # Nothing else differs.
  for saved, version in ((_old(), 1), ({**current, "version": 1}, 1)):
    with pytest.raises(ConfigError, match=rf"order version {version}, this jaxdp reads version {data.stream.VERSION}"):
      data.check_resume(saved, current)
  data.check_resume(dict(current), current)
