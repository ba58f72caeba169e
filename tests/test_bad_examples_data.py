"""A bad example in the path that decodes outside a step's read (a split decoded once in memory, `dataset.cache_mb`)
is named by split and index, or skipped on request, as on the path that reads by index."""

import io
import itertools
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

import bad_datasets  # noqa: F401  `bad_datasets:BadPngs`.
import runs
from jaxdp import data
from jaxdp.batch import REAL
from jaxdp.config import ConfigError
from jaxdp.data import cache

STEPS = 8  # Two epochs of 64 examples in batches of 16: each bad example is met twice.


def _config(data_dir, cache_mb: float, **fields) -> ml_collections.ConfigDict:
  """A run on `bad_datasets:BadPngs` (or `fields["name"]`) with `dataset.cache_mb` and other `dataset` fields."""
  fields = {"name": "bad_datasets:BadPngs", "data_dir": str(data_dir), "cache_mb": cache_mb, **fields}
  return runs.config_with({f"dataset.{k}": v for k, v in fields.items()})


def _load(data_dir, cache_mb: float, **fields) -> data.Dataset:
  """The dataset of `_config(data_dir, cache_mb, **fields)`."""
  return data.load(_config(data_dir, cache_mb, **fields).dataset)


def _train(ds: data.Dataset, process_count: int = 1) -> tuple[list[dict], int]:
  """Global train batches 0..STEPS-1 (each process's rows put together) and the examples they replaced."""
  streams = [data.train_batches(ds, "train", seed=0, global_batch=16, start_step=0, process_index=p,
                                process_count=process_count) for p in range(process_count)]
  per = [list(itertools.islice(s, STEPS)) for s in streams]
  batches = [{k: np.concatenate([pp[s][k] for pp in per]) for k in per[0][s]} for s in range(STEPS)]
  return batches, sum(data.skipped_through(s, STEPS - 1) for s in streams)


def _undecodable(ds: data.Dataset, split: str) -> list[int]:
  """The indices in `split` whose image PIL cannot decode (found independently of jaxdp's pipeline)."""
  source = ds.builder.as_data_source(split, decoders={"image": tfds.decode.SkipDecoding()})
  return [i for i in range(len(source)) if not _opens(source[i]["image"])]


def _opens(encoded: bytes) -> bool:
  """Whether PIL decodes the image."""
  try:
    Image.open(io.BytesIO(encoded)).load()
  except OSError:
    return False
  return True


def _eval(ds: data.Dataset) -> list[dict]:
  return list(data.eval_batches(ds, "test", global_batch=8, process_index=0, process_count=1))


def test_a_bad_example_in_a_cached_split_is_an_error_naming_split_and_index(tmp_path):
  ds = _load(tmp_path, 64, builder_kwargs={"bad_train": (5,), "bad_test": (3,)})
  assert isinstance(ds.corpus, cache.CachedCorpus)  # Small and of fixed size: decoded once, in memory.
  [train], [test] = _undecodable(ds, "train"), _undecodable(ds, "test")
  with pytest.raises(data.BadExampleError, match=rf"cannot decode example {train} of split 'train' \(Invalid PNG"):
    _train(ds)
  with pytest.raises(data.BadExampleError, match=rf"cannot decode example {test} of split 'test' \(Invalid PNG"):
    _eval(ds)


def test_with_skipping_on_a_cached_split_reads_what_the_uncached_path_reads(tmp_path):
  kwargs = {"builder_kwargs": {"bad_train": (5, 17), "bad_test": (3,)}, "skip_bad_examples": True}
  cached, uncached = _load(tmp_path, 64, **kwargs), _load(tmp_path, 0, **kwargs)
  assert isinstance(cached.corpus, cache.CachedCorpus) and not isinstance(uncached.corpus, cache.CachedCorpus)
  batches, skipped = _train(uncached)
  assert skipped == 4  # Two bad examples, two epochs.
  for process_count in (1, 2):
    runs.assert_bitwise(_train(cached, process_count), (batches, skipped))
  evaluated = _eval(uncached)
  assert sum(int(b[REAL].sum()) for b in evaluated) == 19  # The bad test example is left out.
  runs.assert_bitwise(_eval(cached), evaluated)


def test_a_cached_split_where_nothing_decodes_is_one_error_naming_it(tmp_path):
  ds = _load(tmp_path, 64, builder_kwargs={"bad_train": tuple(range(64))})
  with pytest.raises(ConfigError, match=r"^no example of split 'train' decodes \(tried all 64\): Invalid PNG"):
    _train(ds)


def _env() -> dict:
  """This environment, 2 CPU devices, and tests/ importable (for `bad_datasets:BadTrainPngs`)."""
  env = {**os.environ, "JAXDP_CPU_DEVICES": "2",
         "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
  return env


def test_a_bad_example_in_a_cached_split_is_one_error_line_through_the_cli(tmp_path):
  flags = runs.flags({"dataset.name": "bad_datasets:BadTrainPngs", "dataset.data_dir": str(tmp_path / "tfds"),
                      "model.name": "mlp", "model.hidden": "(8,)", "batch_size": 16, "eval_batch_size": 16,
                      "num_train_steps": 8, "log_every_steps": 4, "eval_every_steps": 8,
                      "checkpoint_every_steps": 0})
  proc = subprocess.run([sys.executable, "-m", "jaxdp.train", *flags, "--workdir", str(tmp_path / "run")],
                        capture_output=True, text=True, timeout=240, env=_env())
  assert proc.returncode == 2, proc.stdout + proc.stderr
  errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
  [index] = _undecodable(_load(tmp_path / "tfds", 64, name="bad_datasets:BadTrainPngs"), "train")
  assert len(errors) == 1 and f"cannot decode example {index} of split 'train'" in errors[0], errors
  assert "Traceback" not in proc.stdout + proc.stderr


def test_a_bad_example_in_a_split_kept_on_disk_is_named_and_skipped_by_later_opens_too(tmp_path):
  """The files of a split held decoded keep its bad examples and why each is bad."""
  kwargs = {"builder_kwargs": {"bad_train": (5, 17), "bad_test": (3,)}, "skip_bad_examples": True}
  first = _load(tmp_path, 64, **kwargs)
  expected = _train(first)
  later = _load(tmp_path, 64, **kwargs)
  assert isinstance(next(iter(later.source("train")._arrays.values())).base, np.memmap)  # Mapped, not decoded.
  assert later.source("train").bad == first.source("train").bad and len(later.source("train").bad) == 2
  runs.assert_bitwise(_train(later), expected)
  with pytest.raises(data.BadExampleError, match=r"cannot decode example \d+ of split 'train' \(Invalid PNG"):
    _train(_load(tmp_path, 64, builder_kwargs=kwargs["builder_kwargs"]))
