"""Each built-in dataset config trains two steps (those that need a download under
tfds.testing.mock_data); an unprepared dataset without network fails in seconds with instructions;
the prepared `digits` content is pinned to its builder VERSION."""

import hashlib
import importlib
import math
import shutil
import socket
import tempfile
import threading
import time

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from jaxdp import data, train
from jaxdp.data import tfds_dataset
from jaxdp.data import convert
from jaxdp.config import ConfigError
from jaxdp.datasets import digits  # noqa: F401  (defining its builder registers "digits" with TFDS)

MOCK_EXAMPLES = 40  # Per split: 2 train batches of 16; eval pads 40 to 48.
MOCKED = ["mnist", "fashion_mnist", "cifar10", "cifar100"]


def _two_steps(config: ml_collections.ConfigDict, data_dir: str) -> ml_collections.ConfigDict:
  config.dataset.data_dir = data_dir
  config.batch_size = config.eval_batch_size = 16
  config.parallel.num_devices = 1    # Compiles faster; test_train and test_data cover several devices.
  config.num_train_steps = config.log_every_steps = config.eval_every_steps = 2
  return config


@pytest.mark.parametrize("name", MOCKED)  # `default` and `mlp_digits` (real digits) train in test_train / test_cli.
def test_built_in_config_trains_two_steps(name, tmp_path):
  config = _two_steps(importlib.import_module(f"jaxdp.configs.{name}").get_config(), str(tmp_path / "tfds"))
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):  # Random examples; nothing is downloaded.
    result = train.train_and_evaluate(config, str(tmp_path / "run"))
  assert result.eval_metrics["eval/num_examples"] == MOCK_EXAMPLES
  assert int(result.backend.get(result.state.step)) == 2
  assert math.isfinite(result.eval_metrics["eval/loss"])


@pytest.fixture
def no_network(monkeypatch):
  """Every connection fails as on a machine without network."""
  def unreachable(*args, **kwargs):
    raise OSError(101, "Network is unreachable")

  monkeypatch.setattr(socket, "create_connection", unreachable)


def test_unprepared_dataset_without_network_fails_fast_through_the_cli(no_network, tmp_path, capsys, monkeypatch):
  def never(*args, **kwargs):
    raise AssertionError("download_and_prepare was called for a dataset that cannot be downloaded")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", never)
  tfds_dir, start = str(tmp_path / "tfds"), time.monotonic()
  status = train.main(["train", "--config", "jaxdp/configs/mnist.py", f"--workdir={tmp_path / 'run'}",
                       f"--config.dataset.data_dir={tfds_dir}"])
  assert time.monotonic() - start < 10
  err = capsys.readouterr().err.strip()
  assert status == 2 and err.count("\n") == 0
  assert err.startswith("error: dataset 'mnist' is not prepared") and repr(tfds_dir) in err
  assert "Network is unreachable" in err and "tfds build mnist --data_dir=DIR" in err


def test_a_hanging_network_fails_within_the_probe_timeout(monkeypatch, tmp_path):
  release = threading.Event()

  def hang(*args, **kwargs):  # Like a name server that never answers.
    release.wait(60)
    raise OSError("released")

  monkeypatch.setattr(socket, "create_connection", hang)
  monkeypatch.setattr(tfds_dataset, "PROBE_TIMEOUT_S", 0.5)
  start = time.monotonic()
  try:
    with pytest.raises(ConfigError, match=r"'cifar10' is not prepared .* no answer within 0.5 s"):
      data.load(ml_collections.ConfigDict({"name": "cifar10", "data_dir": str(tmp_path)}))
  finally:
    release.set()
  assert time.monotonic() - start < 5


def test_a_local_builder_prepares_without_network(no_network, tmp_path):
  ds = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": str(tmp_path)}))  # Not yet prepared.
  assert ds.builder.is_prepared() and ds.num_examples("test") == 360


def test_preparing_a_dataset_leaves_no_temp_dir(tmp_path, monkeypatch):
  """TFDS makes an empty /tmp/tmp*tfds for every builder of an unprepared dataset and keeps it
  (`DatasetInfo.initialize_from_bucket`); jaxdp removes those its own builders left (`prepare`)."""
  root = tmp_path / "tmp"
  root.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(root))
  with tfds_dataset._no_temp_dirs_left():
    assert not tfds_dataset.registered("digits", str(tmp_path / "data"), {}).is_prepared()
  assert list(root.iterdir()) == []
  data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": str(tmp_path / "data")}))
  assert list(root.iterdir()) == []


def test_unknown_dataset_is_a_config_error(tmp_path):
  with pytest.raises(ConfigError, match="unknown dataset 'no_such_dataset'"):
    data.load(ml_collections.ConfigDict({"name": "no_such_dataset", "data_dir": str(tmp_path)}))


# sha256 of the prepared examples per digits VERSION: a change to the content or the split must bump
# VERSION (and add its digest here), or a stale prepared copy would be silently reused.
# 1.1.0: the same examples, prepared as ArrayRecord.
DIGITS_CONTENT = {"1.0.0": "699185939cfc7c5cbbced34da3f9fa57e3276b70990deb359d80dfccd30f4c0d",
                  "1.1.0": "699185939cfc7c5cbbced34da3f9fa57e3276b70990deb359d80dfccd30f4c0d"}


def test_digits_content_matches_its_version(data_dir):
  builder = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir})).builder
  assert builder.info.file_format == tfds.core.file_adapters.FileFormat.ARRAY_RECORD
  digest = hashlib.sha256()
  for split in ("train", "test"):
    source = builder.as_data_source(split)
    for i in range(len(source)):
      digest.update(source[i]["image"].tobytes())
      digest.update(np.int64(source[i]["label"]).tobytes())
  assert DIGITS_CONTENT.get(str(builder.version)) == digest.hexdigest()



def test_a_tfrecord_only_dataset_is_one_error_line_with_the_command(tfrecord_dir, tmp_path, capsys):
  status = train.main(["train", "--config", "jaxdp/configs/default.py", f"--workdir={tmp_path / 'run'}",
                       f"--config.dataset.data_dir={tfrecord_dir}"])
  err = capsys.readouterr().err.strip()
  version_dir = tfds.builder("digits", data_dir=tfrecord_dir).data_dir
  assert status == 2 and err.count("\n") == 0, err
  assert err.startswith("error: dataset 'digits' is prepared in") and "as tfrecord only" in err
  assert err.endswith(f"`python -m jaxdp.data.convert {version_dir}`")


def test_the_converted_dataset_reads_the_same_batches(tfrecord_dir, data_dir, tmp_path):
  copy = str(tmp_path / "tfds")
  shutil.copytree(tfrecord_dir, copy)
  assert convert.main(["convert", str(tfds.builder("digits", data_dir=copy).data_dir)]) == 0
  converted = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": copy}))
  prepared = data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir}))  # As ArrayRecord.
  a, b = (next(data.train_batches(ds, "train", seed=0, global_batch=32, start_step=7, process_index=0,
                                  process_count=1)) for ds in (converted, prepared))
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
