"""In-memory data (issue 24): `data.load(config.dataset, train_data=..., eval_data=...)` with a dict of numpy arrays
or a random-access source, read by index in the global order like any dataset, nothing written to a TFDS
directory, fingerprinted by the resume guard; and a regression on in-memory load_diabetes through the Python API."""

import os

import jax
import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds
from flax import nnx
from sklearn.datasets import load_diabetes
from sklearn.linear_model import LinearRegression

import jaxdp
import batches
from jaxdp import data
from jaxdp.batch import INDEX, REAL
from jaxdp.config import ConfigError
from jaxdp.configs import default

B, STEPS = 8, 9  # 60 train examples: 7 steps an epoch, so STEPS crosses into a second epoch.


def _arrays(n, seed=0):
  rng = np.random.RandomState(seed)
  return {"inputs": rng.randn(n, 3), "labels": rng.randn(n), "mask": rng.rand(n, 4) > 0.5,
          "meta": {"id": np.arange(n) + 1000 * seed}, "text": np.array([f"row {i}" for i in range(n)])}


class Rows:
  """A random-access source of example dicts read one at a time (`__getitem__` only)."""

  def __init__(self, arrays):
    self.arrays = arrays

  def __len__(self):
    return len(self.arrays["inputs"])

  def __getitem__(self, i):
    return {"inputs": self.arrays["inputs"][i], "labels": self.arrays["labels"][i], "mask": self.arrays["mask"][i],
            "meta": {"id": self.arrays["meta"]["id"][i]}, "text": f"row {i}"}


class BatchedRows(Rows):
  """The same, read a batch of indices at a time (`__getitems__`, as tfds and Hugging Face sources)."""

  def __getitems__(self, indices):
    return [self[i] for i in indices]


def _load(train=None, test=None, **fields):
  return data.load(ml_collections.ConfigDict(fields), train_data=train, eval_data=test)


def _train(ds, process_index=0, process_count=1):
  return batches.train(ds, seed=1, global_batch=B, steps=STEPS, process_index=process_index,
                       process_count=process_count)


def _global(ds, process_count):
  return batches.global_batches(ds, process_count, seed=1, global_batch=B, steps=STEPS)


@pytest.mark.parametrize("wrap", [dict, Rows, BatchedRows])
def test_in_memory_data_is_read_by_index_in_the_global_order(wrap):
  train, test = _arrays(60), _arrays(21, seed=1)
  ds = _load(wrap(train), wrap(test))
  assert ds.name.startswith("<in-memory>@") and ds.float_labels and ds.input_shape == (3,)
  spec = ds.element_spec()
  assert sorted(spec) == ["inputs", "labels", "mask", "meta/id"]  # Text left out; nested keys flattened.
  assert spec["inputs"].dtype == np.float32 and spec["labels"].dtype == np.float32 and spec["meta/id"].dtype == np.int32
  one = _global(ds, 1)
  batches.assert_same(one, _global(ds, 2))  # 1 and 2 processes: the same global batches.
  epoch = np.concatenate([b[INDEX] for b in one[:7]])
  assert sorted(epoch) == sorted(set(epoch)) and len(epoch) == 56  # An epoch reads each example at most once.
  for batch in one:
    i = batch[INDEX]
    np.testing.assert_allclose(batch["inputs"], train["inputs"][i].astype(np.float32))
    np.testing.assert_array_equal(batch["labels"], train["labels"][i].astype(np.float32))
    np.testing.assert_array_equal(batch["mask"], train["mask"][i])
    np.testing.assert_array_equal(batch["meta/id"], train["meta"]["id"][i])
  seen = []
  for p in range(2):
    for batch in data.eval_batches(ds, "test", global_batch=B, process_index=p, process_count=2):
      seen += list(batch["meta/id"][batch[REAL]])
  assert sorted(seen) == list(range(1000, 1021))  # Every eval example once.


def test_a_tfds_data_source_reads_as_its_arrays(data_dir):
  """A `tfds.data_source` (examples decoded by TFDS) gives the batches of the same examples as arrays."""
  source = tfds.data_source("digits", data_dir=data_dir, split="train")
  examples = [source[i] for i in range(len(source))]
  arrays = {k: np.stack([e[k] for e in examples]) for k in examples[0]}
  from_source, from_arrays = _load(source), _load(arrays)
  assert sorted(from_source.element_spec()) == ["image", "label"]  # No "inputs"/"labels": its own names.
  batches.assert_same(_train(from_source), _train(from_arrays))


def test_nothing_is_written_to_a_tfds_directory(tmp_path, monkeypatch):
  home, tfds_dir, data_dir = tmp_path / "home", tmp_path / "tfds_env", tmp_path / "data_dir"
  for d in (home, tfds_dir, data_dir):
    d.mkdir()
  monkeypatch.setenv("HOME", str(home))
  monkeypatch.setenv("TFDS_DATA_DIR", str(tfds_dir))
  ds = _load(_arrays(60), _arrays(21, seed=1), data_dir=str(data_dir), cache_mb=64)
  _train(ds)
  list(data.eval_batches(ds, "test", global_batch=B, process_index=0, process_count=1))
  data.stream_spec(ds, "train", seed=1, global_batch=B)
  assert [os.listdir(d) for d in (home, tfds_dir, data_dir)] == [[], [], []]


def test_the_resume_guard_refuses_changed_data():
  def spec(train):
    return data.stream_spec(_load(train), "train", seed=1, global_batch=B)

  saved = spec(_arrays(60))
  assert saved["dataset"].startswith("<in-memory>@") and saved["source"] == "in-memory"
  data.check_resume(saved, spec(_arrays(60)))  # The same data (another copy): resumes.
  changed = _arrays(60)
  changed["labels"][17] += 1e-3  # One value of one array.
  with pytest.raises(ConfigError, match="dataset '<in-memory>@"):
    data.check_resume(saved, spec(changed))
  with pytest.raises(ConfigError, match="dataset '<in-memory>@"):
    data.check_resume(saved, spec(BatchedRows(changed)))  # A source's sample of rows holds row 17's label too.
  longer, last_changed = _arrays(200), _arrays(200)
  last_changed["labels"][-1] += 1e-3  # A source's sample spans its rows, the last one among them.
  with pytest.raises(ConfigError, match="dataset '<in-memory>@"):
    data.check_resume(spec(BatchedRows(longer)), spec(BatchedRows(last_changed)))
  retyped = _arrays(60)
  retyped["labels"] = retyped["labels"].view(np.int64)  # float64 labels' bytes, as integers.
  with pytest.raises(ConfigError, match="dataset '<in-memory>@"):  # The same bytes read as another dtype.
    data.check_resume(saved, spec(retyped))


@pytest.mark.parametrize("train, words", [
    ({"inputs": np.zeros((4, 2)), "labels": np.zeros(3)}, ["train_data", "one leading length", "(3,)"]),
    ({"inputs": np.float32(1.0)}, ["train_data", "one leading length", "inputs () float32"]),
    ({"text": np.array(["a", "b"])}, ["train_data", "dict of numeric arrays", "text (2,) <U1"]),
    ([1, 2, 3], ["train_data", "an example must be a dict", "int"]),
    ([], ["train_data ('train') has no examples"]),
    (object(), ["train_data", "random-access source", "object"]),
])
def test_bad_in_memory_data_is_a_config_error_naming_it(train, words):
  with pytest.raises(ConfigError) as e:
    _load(train)
  assert all(w in str(e.value) for w in words), str(e.value)


def test_splits_of_different_features_are_a_config_error():
  test = _arrays(8)
  del test["mask"]
  with pytest.raises(ConfigError, match="different features"):
    _load(_arrays(60), test)


def test_classes_are_counted_over_every_row_and_float_labels_have_none():
  arrays = _arrays(100)
  assert _load(arrays).num_classes == 0 and _load(BatchedRows(arrays)).num_classes == 0  # Regression targets.
  arrays["labels"] = np.zeros(100, np.int64)
  arrays["labels"][50] = 9  # Not the first row of any read.
  assert _load(arrays).num_classes == _load(BatchedRows(arrays)).num_classes == 10


def test_train_and_eval_data_need_two_split_names():
  with pytest.raises(ConfigError, match="dataset.train_split and dataset.eval_split are both 'all'"):
    _load(_arrays(60), _arrays(8), train_split="all", eval_split="all")


def test_uint8_inputs_are_images_only_with_height_width_and_channels():
  """uint8 [N, H, W, C] are pixels (cast to the compute dtype); uint8 of another rank are ids, kept exact."""
  labels = np.arange(8) % 2
  images = _load({"inputs": np.zeros((8, 4, 4, 3), np.uint8), "labels": labels})
  ids = _load({"inputs": np.zeros((8, 4), np.uint8), "labels": labels})
  assert (images.corpus.facts.image, images.integer_inputs) == (True, False)
  assert (ids.corpus.facts.image, ids.integer_inputs) == (False, True)


# Acceptance (issue 24): a regression on in-memory arrays through the Python API, on 8 fake devices.

class LinearRegressor(nnx.Module):
  """y = x w + b: one output, reshaped by the regression task to the target's shape."""

  def __init__(self, rngs: nnx.Rngs):
    self.linear = nnx.Linear(10, 1, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.linear(x)


def _diabetes_split():
  """load_diabetes, its last 20% the test split; inputs and targets standardized by the train split's statistics."""
  x, y = load_diabetes(return_X_y=True)
  cut = int(round(len(x) * 0.8))
  mean, std = x[:cut].mean(0), x[:cut].std(0)
  y_mean, y_std = y[:cut].mean(), y[:cut].std()
  x, y = ((x - mean) / std).astype(np.float32), ((y - y_mean) / y_std).astype(np.float32)
  return (x[:cut], y[:cut]), (x[cut:], y[cut:]), y_std


def test_a_linear_regression_on_in_memory_arrays_matches_scikit_learn(tmp_path, capsys):
  (x_train, y_train), (x_test, y_test), y_std = _diabetes_split()
  reference = LinearRegression().fit(x_train, y_train)
  sklearn_mse = float(np.mean((reference.predict(x_test) - y_test) ** 2)) * y_std**2  # In the target's units.
  config = default.get_config()
  config.batch_size, config.eval_batch_size, config.num_train_steps = 64, 32, 800
  config.learning_rate, config.lr_schedule = 0.05, "cosine"
  config.log_every_steps, config.eval_every_steps = 400, 800
  config.checkpoint_every_steps = 0
  config.best_metric, config.best_mode = "eval/mse", "min"
  result = jaxdp.train_and_evaluate(config, str(tmp_path / "run"), model=LinearRegressor,
                                    train_data={"inputs": x_train, "labels": y_train},
                                    eval_data={"inputs": x_test, "labels": y_test})
  assert jax.device_count() == 8 and result.eval_metrics["eval/num_examples"] == len(x_test)
  jaxdp_mse = result.eval_metrics["eval/mse"] * y_std**2
  with capsys.disabled():
    print(f"\nload_diabetes test MSE: jaxdp {jaxdp_mse:.1f}, scikit-learn LinearRegression {sklearn_mse:.1f} "
          f"(ratio {jaxdp_mse / sklearn_mse:.4f})")
  assert abs(jaxdp_mse / sklearn_mse - 1) < 0.05
