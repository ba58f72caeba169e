"""Your own data as dataset.name: a TFDS builder class by "module:Builder", an image folder, an .npz file."""

import hashlib
import os

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from jaxdp import train
from jaxdp.config import ConfigError
from jaxdp import data
from jaxdp.datasets import image_folder

CLASSES = ("ant", "bee", "cat")
SIZES = ((12, 10), (16, 16), (9, 14))  # (H, W): three sizes.


def make_folder(root, per_class: int = 8, sizes=SIZES, splits: tuple[str, ...] = ()) -> str:
  """Class subfolders of tiny random JPEG and PNG images (under split subfolders when given)."""
  rng = np.random.RandomState(0)
  for split in splits or ("",):
    for c in CLASSES:
      os.makedirs(os.path.join(root, split, c), exist_ok=True)
      for i in range(per_class):
        h, w = sizes[i % len(sizes)]
        path = os.path.join(root, split, c, f"{i}.{'jpg' if i % 2 else 'png'}")
        Image.fromarray(rng.randint(0, 255, (h, w, 3), np.uint8)).save(path)
  return str(root)


def builder_for(name: str, data_dir: str, kwargs: dict) -> tfds.core.DatasetBuilder | None:
  """The builder the kind that claims `name` makes (`jaxdp.data.find`); None for a registered TFDS name."""
  kind = data.find(name)
  return None if kind is data.TFDS_NAME else kind.make(name, data_dir, kwargs)


def _files(root) -> list[str]:
  """Every image file under root."""
  return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


def prepared(builder: tfds.core.DatasetBuilder) -> tfds.core.DatasetBuilder:
  builder.download_and_prepare()
  return builder


@pytest.mark.parametrize("name", ["digits", "mnist", "mnist:3.0.1", "cifar10/plain:3.*.*", "text_file"])
def test_registered_tfds_names_are_not_claimed(name, tmp_path):
  assert builder_for(name, str(tmp_path), {}) is None


def test_a_folder_is_named_as_a_path_not_as_a_bare_tfds_name(tmp_path, monkeypatch):
  make_folder(tmp_path / "mnist", per_class=2)
  monkeypatch.chdir(tmp_path)
  assert builder_for("mnist", str(tmp_path / "tfds"), {}) is None  # Still TFDS's mnist.
  assert builder_for("./mnist", str(tmp_path / "tfds"), {}).name == "image_folder"


def test_builder_class_by_module_name_prepares_array_record(tmp_path):
  builder = builder_for("user_datasets:TinyBlobs", str(tmp_path), {"spread": 0.1})
  assert type(builder).__name__ == "TinyBlobs" and builder.spread == 0.1  # builder_kwargs reach the class.
  prepared(builder)
  assert builder.info.file_format.value == "array_record"
  source = builder.as_data_source("train")
  assert len(source) == 96 and source[0]["x"].shape == (8,)


@pytest.mark.parametrize("name, words", [
    ("user_datasets:Missing", ["user_datasets:Missing", "has no 'Missing'"]),
    ("no_such_module_h3b:Builder", ["no_such_module_h3b", "cannot import"]),
    ("user_datasets:NotABuilder", ["user_datasets:NotABuilder", "not a TFDS builder"]),
    ("user_datasets:NoExamples", ["user_datasets:NoExamples", "does not define _generate_examples"]),
])
def test_bad_builder_name_is_a_config_error_naming_it(name, words, tmp_path):
  with pytest.raises(ConfigError) as e:
    builder_for(name, str(tmp_path), {})
  assert all(w in str(e.value) for w in words), str(e.value)


def test_image_folder_of_varying_sizes(tmp_path):
  root = make_folder(tmp_path / "photos")
  builder = prepared(builder_for(root, str(tmp_path / "tfds"), {}))
  image = builder.info.features["image"]
  assert image.shape == (None, None, 3)
  assert builder.info.features["label"].names == list(CLASSES)
  n_test = sum(image_folder.in_test(os.path.relpath(p, root), 0.1) for p in _files(root))  # The digest split.
  assert builder.info.splits["train"].num_examples == 24 - n_test and builder.info.splits["test"].num_examples == n_test
  train = builder.as_data_source("train")
  shapes = {train[i]["image"].shape for i in range(len(train))}
  assert shapes == {(h, w, 3) for h, w in SIZES}
  assert sorted(train[i]["label"] for i in range(len(train))) == sorted(
      CLASSES.index(os.path.basename(os.path.dirname(p))) for p in _files(root)
      if not image_folder.in_test(os.path.relpath(p, root), 0.1))


def test_image_folder_keeps_pixels_and_split_subfolders(tmp_path):
  root = make_folder(tmp_path / "photos", per_class=2, sizes=((6, 5),), splits=("train", "test"))
  builder = prepared(builder_for(root, str(tmp_path / "tfds"), {}))
  assert builder.info.features["image"].shape == (6, 5, 3)  # One size: a fixed shape.
  assert {s: builder.info.splits[s].num_examples for s in ("train", "test")} == {"train": 6, "test": 6}
  test = builder.as_data_source("test")
  original = np.asarray(Image.open(os.path.join(root, "test", "cat", "0.png")))
  # A PNG's pixels survive exactly (lossless), with their label.
  assert any(np.array_equal(test[i]["image"], original) and test[i]["label"] == 2 for i in range(len(test)))


def test_image_folder_grayscale_and_mixed_modes(tmp_path):
  root = tmp_path / "gray"
  for c in CLASSES[:2]:
    os.makedirs(root / c)
    for i in range(3):
      Image.fromarray(np.full((4, 4), 40 * i, np.uint8)).save(root / c / f"{i}.png")
  gray = prepared(builder_for(str(root), str(tmp_path / "tfds"), {"test_fraction": 0.5}))
  assert gray.info.features["image"].shape == (4, 4, 1)
  assert gray.info.splits["test"].num_examples + gray.info.splits["train"].num_examples == 6
  Image.fromarray(np.zeros((4, 4, 4), np.uint8), "RGBA").save(root / "ant" / "rgba.png")
  builder = prepared(builder_for(str(root), str(tmp_path / "tfds"), {"test_fraction": 0.5}))
  assert builder.info.features["image"].shape == (4, 4, 3)  # Not all grayscale: RGB, the RGBA one converted.
  train = builder.as_data_source("train")
  assert {train[i]["image"].shape for i in range(len(train))} == {(4, 4, 3)}


def _digest_test_files(names: list[str], fraction: float) -> set[str]:
  """The documented split, written out: the first 8 bytes of SHA-256(relative path) / 2**64 < test_fraction."""
  return {n for n in names if int(hashlib.sha256(n.encode()).hexdigest()[:16], 16) < fraction * 2**64}


def _split_of(root) -> dict[str, str]:
  """relative path -> split, as the image folder assigns them."""
  _, splits = image_folder.list_files(str(root), 0.1)
  return {os.path.relpath(p, root): s for s, files in splits.items() for p, _ in files}


def test_a_file_keeps_its_split_when_others_are_added(tmp_path):
  make_folder(tmp_path / "photos", per_class=10)
  before = _split_of(tmp_path / "photos")
  for i in range(10, 30):  # cat/10 ... cat/29, one at a time: each addition moves no file already there.
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "photos" / "cat" / f"{i}.png")
    after = _split_of(tmp_path / "photos")
    assert {p: after[p] for p in before} == before, f"adding cat/{i}.png moved a file"
    before = after
  assert set(after.values()) == {"train", "test"} and len(after) == 50


def test_the_split_is_by_each_files_digest_not_by_name(tmp_path):
  os.makedirs(tmp_path / "photos" / "cat")
  os.makedirs(tmp_path / "photos" / "dog")
  names = [f"cat/{i:03d}.png" for i in range(100)] + ["dog/0.png", "dog/1.png"]
  for name in names:
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "photos" / name)
  split = _split_of(tmp_path / "photos")
  test = {n for n, s in split.items() if s == "test"}
  assert test == _digest_test_files(names, 0.1)
  assert 3 <= len(test) <= 20  # About 10%, and neither the first nor the last names.
  assert test != set(names[:len(test)]) and test != set(names[100 - len(test):100])


def test_prepared_copy_depends_on_the_source_identity(tmp_path):
  a = make_folder(tmp_path / "a", per_class=2)
  b = make_folder(tmp_path / "b", per_class=2)  # Same files, another folder.
  data_dir = str(tmp_path / "tfds")
  first = builder_for(a, data_dir, {})
  assert first.data_dir != builder_for(b, data_dir, {}).data_dir
  assert first.data_dir == builder_for(a, data_dir, {}).data_dir  # Stable: reused.
  path = os.path.join(a, "ant", "0.png")
  os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))  # "Changed" file.
  assert first.data_dir != builder_for(a, data_dir, {}).data_dir


def test_missing_paths_are_config_errors(tmp_path):
  for name in (str(tmp_path / "nowhere"), "./nowhere_h3b"):
    with pytest.raises(ConfigError, match="not found"):
      builder_for(name, str(tmp_path), {})
  with pytest.raises(ConfigError, match="not found"):
    _load_npz(str(tmp_path / "x.npz"))
  os.makedirs(tmp_path / "empty" / "cls")
  with pytest.raises(ConfigError, match="no class subfolders of images"):
    builder_for(str(tmp_path / "empty"), str(tmp_path), {})


def _load_npz(path: str, **kwargs):
  """The dataset of the .npz file `path`, opened as `config.dataset.name` names it."""
  from jaxdp import data
  return data.load(ml_collections.ConfigDict({"name": path, "builder_kwargs": kwargs}))


def _read_all(ds, split: str) -> dict[str, np.ndarray]:
  """Every row of a split, in its order."""
  source = ds.source(split)
  return source.read(np.arange(len(source)))


def test_npz_with_one_set_is_split_deterministically(tmp_path):
  rng = np.random.RandomState(0)
  x, y = rng.randn(50, 4), rng.randint(0, 3, 50)
  np.savez(tmp_path / "blobs.npz", x=x, y=y)
  ds = _load_npz(str(tmp_path / "blobs.npz"), test_fraction=0.2)
  assert ds.input_shape == (4,) and ds.element_spec()["inputs"].dtype == np.float32 and ds.num_classes == 3
  order = np.random.RandomState(0).permutation(50)  # The documented split: seed 0, first 20% -> test.
  test = _read_all(ds, "test")["inputs"]
  got = sorted(tuple(np.round(r, 5)) for r in test)
  assert got == sorted(tuple(np.round(x[j].astype(np.float32), 5)) for j in order[:10])


def test_an_npz_is_held_in_memory_and_writes_nothing(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  np.savez(tmp_path / "c.npz", x=np.zeros((10, 2)), y=np.arange(10) % 2)
  ds = _load_npz(str(tmp_path / "c.npz"))
  assert ds.builder is None and ds.kind == "npz" and ds.name.startswith("c.npz@")
  assert sorted(os.listdir(tmp_path)) == ["c.npz"]


def test_npz_keras_layout_uint8_images(tmp_path):
  rng = np.random.RandomState(1)
  arrays = {"x_train": rng.randint(0, 255, (20, 6, 6), np.uint8), "y_train": rng.randint(0, 4, 20),
            "x_test": rng.randint(0, 255, (7, 6, 6), np.uint8), "y_test": rng.randint(0, 4, 7)}
  np.savez(tmp_path / "pics.npz", **arrays)
  ds = _load_npz(str(tmp_path / "pics.npz"))
  assert ds.corpus.facts.image and ds.input_shape == (6, 6, 1)
  test = _read_all(ds, "test")
  got = {x[..., 0].tobytes(): y for x, y in zip(test["inputs"], test["labels"])}
  assert got == {x.tobytes(): y for x, y in zip(arrays["x_test"], arrays["y_test"])}


@pytest.mark.parametrize("arrays, words", [
    ({"x": np.zeros((4, 2)), "y": np.zeros(3, int)}, ["x (4, 2)", "y (3,)"]),
    ({"x": np.zeros((8, 2)), "y": -np.ones(8, int)}, ["labels y", ">= 0"]),
    ({"x_train": np.zeros((4, 2)), "y_train": np.zeros(4, int), "x_test": np.zeros((2, 2)), "m_train": np.zeros(4)},
     ["missing: m_test, y_test"]),
    ({"x": np.zeros((8, 2)), "y": np.zeros(8, int), "labels": np.zeros(8)}, ["'labels'", "rename one"]),
    ({"x_train": np.zeros((4, 2)), "y_train": np.zeros(4, int), "x_test": np.zeros((2, 2)), "y_test": np.zeros(2, int),
      "meta": np.zeros(4)}, ["without a suffix: meta"]),
])
def test_bad_npz_is_a_config_error_naming_it(arrays, words, tmp_path):
  np.savez(tmp_path / "bad.npz", **arrays)
  with pytest.raises(ConfigError) as e:
    _load_npz(str(tmp_path / "bad.npz"))
  assert "bad.npz" in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def _npz_dataset(tmp_path, **arrays):
  np.savez(tmp_path / "arrays.npz", **arrays)
  return _load_npz(str(tmp_path / "arrays.npz"), test_fraction=0.25)


def _split_rows(ds, split):
  from jaxdp import data
  from jaxdp.batch import REAL
  batches = list(data.eval_batches(ds, split, global_batch=4, process_index=0, process_count=1))
  return {k: np.concatenate([b[k][b[REAL]] for b in batches]) for k in batches[0] if k != REAL}


def test_npz_float_and_multidimensional_targets_and_extra_arrays_are_features(tmp_path):
  rng = np.random.RandomState(0)
  x, y = rng.randn(40, 3), rng.randn(40, 2, 2)  # float64 targets of two dimensions per example.
  mask, weight = rng.rand(40, 3) > 0.5, rng.rand(40)
  ds = _npz_dataset(tmp_path, x=x, y=y, mask=mask, weight=weight)
  spec = ds.element_spec()
  assert sorted(spec) == ["inputs", "labels", "mask", "weight"] and ds.float_labels and ds.num_classes == 0
  assert spec["labels"].shape == (2, 2) and spec["labels"].dtype == np.float32 and spec["mask"].dtype == np.bool_
  rows = _split_rows(ds, "test")
  order = np.random.RandomState(0).permutation(40)[:10]  # The documented split: seed 0, first 25% -> test.
  key = lambda a: sorted(map(tuple, np.round(a.reshape(len(a), -1).astype(np.float64), 4)))  # Rows as a multiset (file order).
  for name, truth in (("inputs", x), ("labels", y), ("mask", mask), ("weight", weight[:, None])):
    assert key(rows[name]) == key(truth[order].astype(rows[name].dtype)), name
  by_input = {tuple(np.round(r, 4)): i for i, r in enumerate(rows["inputs"])}  # The features of a row stay together.
  for j in order:
    i = by_input[tuple(np.round(x[j].astype(np.float32), 4))]
    np.testing.assert_allclose(rows["labels"][i], y[j], rtol=1e-6)
    assert rows["mask"][i].tolist() == mask[j].tolist() and np.isclose(rows["weight"][i], weight[j])


def test_npz_without_a_supervised_pair_gives_its_arrays_by_name(tmp_path):
  a, b = np.arange(16.0).reshape(8, 2), np.arange(8, dtype=np.int32)
  ds = _npz_dataset(tmp_path, a=a, b=b)
  assert sorted(ds.element_spec()) == ["a", "b"] and ds.num_classes == 0
  rows = _split_rows(ds, "train")
  np.testing.assert_array_equal(rows["a"], a[rows["b"]])  # Row i of a and b: the same example.


def test_npz_keras_layout_with_extra_arrays(tmp_path):
  rng = np.random.RandomState(2)
  arrays = {f"{k}_{s}": v for s, n in (("train", 12), ("test", 5)) for k, v in
            (("x", rng.randn(n, 4)), ("y", rng.randint(0, 3, n)), ("w", np.arange(n, dtype=np.float32)))}
  ds = _npz_dataset(tmp_path, **arrays)
  assert sorted(ds.element_spec()) == ["inputs", "labels", "w"] and ds.num_classes == 3 and not ds.float_labels
  rows = _split_rows(ds, "test")
  np.testing.assert_array_equal(rows["labels"], arrays["y_test"][rows["w"].astype(int)])


# End to end: each kind of user data trains through jaxdp.data.load and jaxdp.train.

def _blobs_npz(root) -> str:
  rng = np.random.RandomState(0)
  y = np.arange(60) % 3
  np.savez(root / "blobs.npz", x=rng.randn(60, 4) + 3 * y[:, None], y=y)
  return str(root / "blobs.npz")


@pytest.mark.parametrize("kind", ["module", "image_folder", "npz"])
def test_user_data_trains_end_to_end(kind, config, tmp_path):
  name, num_test = {"module": ("user_datasets:TinyBlobs", 24), "image_folder": (None, 4), "npz": (None, 6)}[kind]
  if kind == "image_folder":
    name = make_folder(tmp_path / "photos")  # 4 of its 24 files fall to test by their digests.
    config.dataset.image_size = 8  # Images of three sizes: random-resized crops to 8x8 (eval: center crops).
    config.dataset.flip = True
  elif kind == "npz":
    name = _blobs_npz(tmp_path)
  config.dataset.name = name
  config.dataset.data_dir = str(tmp_path / "tfds")
  config.batch_size, config.eval_batch_size = 16, 16
  result = train.train_and_evaluate(config, str(tmp_path / "run"))
  assert int(result.backend.get(result.state.step)) == config.num_train_steps
  assert result.eval_metrics["eval/num_examples"] == num_test  # Every test example once.
  assert np.isfinite(result.eval_metrics["eval/loss"])


def test_float_labels_are_targets(tmp_path):
  """A regression dataset (float labels) loads as one (it was refused, and before that ZeroDivisionError)."""
  from jaxdp import data
  ds = data.load(ml_collections.ConfigDict({"name": "user_datasets:FloatLabels", "data_dir": str(tmp_path)}))
  assert ds.float_labels and ds.element_spec()["labels"].dtype == np.float32 and ds.num_classes == 0
  batch = next(data.train_batches(ds, "train", seed=0, global_batch=16, start_step=0, process_index=0,
                                  process_count=1))
  assert set(np.unique(batch["labels"])) <= {0.0, 0.5, 1.0} and batch["labels"].dtype == np.float32


def test_npz_split_sizes_round_and_every_example_falls_in_one_split(tmp_path):
  x, y = np.arange(94, dtype=np.float32).reshape(47, 2), np.arange(47) % 2
  np.savez(tmp_path / "odd.npz", x=x, y=y)
  ds = _load_npz(str(tmp_path / "odd.npz"), test_fraction=0.1)
  order = np.random.RandomState(0).permutation(47)  # 4.7 test examples round to 5.
  for split, rows in (("test", order[:5]), ("train", order[5:])):
    assert sorted(map(tuple, _read_all(ds, split)["inputs"])) == sorted(map(tuple, x[rows])), split


def test_npz_arrays_keep_their_shapes_and_integer_labels_are_classes(tmp_path):
  rng = np.random.RandomState(0)
  x = rng.randint(0, 255, (12, 4, 4, 2), np.uint8)  # Two channels: kept as they are.
  np.savez(tmp_path / "pairs.npz", x=x, y=rng.randint(0, 3, (12, 2)))  # Two classes per example, as token labels.
  ds = _load_npz(str(tmp_path / "pairs.npz"), test_fraction=0.25)
  assert ds.input_shape == (4, 4, 2) and ds.label_shape == (2,) and ds.num_classes == 3 and not ds.float_labels


def test_a_held_out_fraction_or_file_of_more_arrays_is_data_of_its_own(tmp_path):
  """The dataset's name (in the stream spec, so a checkpoint's resume check) changes with the split and the data."""
  path = str(tmp_path / "c.npz")
  np.savez(path, x=np.zeros((10, 2)), y=np.arange(10) % 2)
  names = {f: _load_npz(path, test_fraction=f).name for f in (0.1, 0.2)}
  assert names[0.1] != names[0.2] and names[0.1] == _load_npz(path, test_fraction=0.1).name
  np.savez(path, x=np.zeros((10, 2)), y=np.arange(10) % 2, w=np.zeros(10))
  assert _load_npz(path, test_fraction=0.1).name != names[0.1]


@pytest.mark.parametrize("fraction", [True, 0, 1, "0.1"])
def test_a_bad_test_fraction_is_a_config_error_naming_it(tmp_path, fraction):
  np.savez(tmp_path / "c.npz", x=np.zeros((10, 2)), y=np.arange(10) % 2)
  with pytest.raises(ConfigError, match=f"test_fraction must be in \\(0, 1\\), got {fraction!r}"):
    _load_npz(str(tmp_path / "c.npz"), test_fraction=fraction)


def test_an_npz_whose_fraction_leaves_a_split_empty_is_a_config_error(tmp_path):
  np.savez(tmp_path / "few.npz", x=np.zeros((5, 2)), y=np.arange(5) % 2)
  with pytest.raises(ConfigError, match="test_fraction 0.05 of the 5 examples .* leaves a split empty"):
    _load_npz(str(tmp_path / "few.npz"), test_fraction=0.05)


def test_an_npz_counts_the_classes_of_both_splits(tmp_path):
  arrays = {"x_train": np.zeros((4, 2)), "y_train": np.array([0, 1, 1, 0]), "x_test": np.zeros((2, 2)),
            "y_test": np.array([4, 0])}  # A class seen in test only still counts.
  np.savez(tmp_path / "k.npz", **arrays)
  assert _load_npz(str(tmp_path / "k.npz")).num_classes == 5


def test_hidden_folders_and_files_are_not_classes_or_images(tmp_path):
  root = make_folder(tmp_path / "photos", per_class=2)
  for hidden in (os.path.join(root, ".ipynb_checkpoints"), os.path.join(root, "cat")):
    os.makedirs(hidden, exist_ok=True)
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(os.path.join(hidden, ".thumb.png"))
  classes, splits = image_folder.list_files(root, 0.1)
  assert classes == list(CLASSES) and sum(len(f) for f in splits.values()) == 6


def test_an_image_folder_of_16_bit_grayscale_is_grayscale(tmp_path):
  for c in CLASSES[:2]:
    os.makedirs(tmp_path / "deep" / c)
    Image.fromarray(np.full((4, 4), 40, np.uint8)).save(tmp_path / "deep" / c / "a.png")
    Image.fromarray(np.full((4, 4), 300, np.uint16)).save(tmp_path / "deep" / c / "b.png")  # Mode I;16 (or I).
  shape, unreadable = image_folder.image_shape(_files(tmp_path / "deep"))
  assert shape == (4, 4, 1) and not unreadable


def test_skipping_bad_files_prepares_a_copy_of_its_own(tmp_path):
  root, data_dir = make_folder(tmp_path / "photos", per_class=2), str(tmp_path / "tfds")
  strict = builder_for(root, data_dir, {})
  skipping = data.find(root).make(root, data_dir, {}, skip_bad=True)
  assert skipping.data_dir != strict.data_dir  # A copy that left files out is never read as the whole folder.


def test_a_split_that_gets_no_file_is_left_out(tmp_path):
  os.makedirs(tmp_path / "few" / "cat")
  for i in range(2):
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "few" / "cat" / f"{i}.png")
  assert not _digest_test_files(["cat/0.png", "cat/1.png"], 0.01)
  _, splits = image_folder.list_files(str(tmp_path / "few"), 0.01)
  assert list(splits) == ["train"]
