"""The resume guard on a random-access source that carries its own identity: a Hugging Face `datasets.Dataset`."""

import ml_collections
import numpy as np
import pytest

from jaxdp import data
from jaxdp.config import ConfigError
from jaxdp.data import arrays

hf = pytest.importorskip("datasets", reason="Hugging Face datasets (the test extra) is not installed")


def _hf(rows: int, changed_row: int | None = None) -> "hf.Dataset":
  """An in-memory Hugging Face Dataset (no network), numpy-formatted; one label changed at `changed_row`."""
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 10, rows)
  if changed_row is not None:
    labels[changed_row] = (labels[changed_row] + 1) % 10
  return hf.Dataset.from_dict({"inputs": rng.normal(size=(rows, 3)).astype(np.float32),
                               "labels": labels}).with_format("numpy")


def _spec(source) -> dict:
  ds = data.load(ml_collections.ConfigDict({}), train_data=source)
  return data.stream_spec(ds, "train", seed=1, global_batch=8)


def test_a_hugging_face_dataset_changed_in_one_unsampled_row_is_refused_on_resume():
  rows = 200
  sampled = set(np.linspace(0, rows - 1, arrays.SAMPLE_ROWS).astype(np.int64))
  row = next(i for i in range(rows) if i not in sampled)  # A row the 64-row sample never reads.
  saved = _spec(_hf(rows))
  data.check_resume(saved, _spec(_hf(rows)))  # The same rows, built again: the same fingerprint, resumes.
  with pytest.raises(ConfigError, match="the checkpoint's input stream differs \\(dataset '<in-memory>@"):
    data.check_resume(saved, _spec(_hf(rows, changed_row=row)))
