"""Batches of every feature (issue 24): a features-dict dataset reaches the batch whole, under its features' own
names (nested ones flattened with "/"), in the one global order, the same through the in-memory cache, every
eval example once; the stream spec names the features."""


import ml_collections
import numpy as np
import pytest

import feature_datasets
import batches
from jaxdp import data
from jaxdp.batch import INDEX, REAL
from jaxdp.config import ConfigError
from jaxdp.datasets import digits  # noqa: F401  (defining its builder registers "digits" with TFDS)

B, STEPS = 8, 7  # 48 train examples: 6 steps an epoch, so STEPS crosses into a second epoch.
PLAIN, SUPERVISED = "feature_datasets:Scenes", "feature_datasets:SupervisedScenes"
OWN = ("image", "mask", "meta/id", "meta/weight", "target")  # Scenes' features a batch holds ("name" is text).


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


def _load(tfds_dir, name, **fields):
  return data.load(ml_collections.ConfigDict({"name": name, "data_dir": tfds_dir, "cache_mb": 0, **fields}))


def _train(ds, process_index=0, process_count=1, steps=STEPS):
  return batches.train(ds, seed=3, global_batch=B, steps=steps, process_index=process_index,
                       process_count=process_count)


def _global(ds, process_count):
  return batches.global_batches(ds, process_count, seed=3, global_batch=B, steps=STEPS)


def test_a_dataset_without_supervised_keys_gives_every_feature_under_its_own_name(tfds_dir):
  ds = _load(tfds_dir, PLAIN)
  spec = ds.element_spec()
  assert sorted(spec) == sorted(OWN) and not ds.float_labels
  assert spec["mask"].shape == (8, 8) and spec["mask"].dtype == np.bool_ and spec["target"].shape == (2,)
  for batch in _train(ds):
    assert sorted(batch) == sorted([*OWN, INDEX])
    for name, s in spec.items():  # The batch holds what element_spec says, with a batch axis.
      assert batch[name].shape == (B, *s.shape) and batch[name].dtype == s.dtype, name
    _assert_whole(batch)


def _assert_whole(batch, image="image", target="target"):
  """Each row's features are one example's (the one its meta/id names), all of them."""
  for row, id in enumerate(batch["meta/id"]):
    truth = feature_datasets.example(int(id))
    np.testing.assert_array_equal(batch[image][row], truth["image"])
    np.testing.assert_array_equal(batch["mask"][row], truth["mask"])
    np.testing.assert_array_equal(batch[target][row], truth["target"])
    assert batch["meta/weight"][row] == truth["meta"]["weight"]


def test_supervised_keys_are_inputs_and_labels_and_the_others_keep_their_names(tfds_dir):
  ds = _load(tfds_dir, SUPERVISED, mean=(0.5,), std=(0.25,))
  spec = ds.element_spec()
  assert sorted(spec) == ["inputs", "labels", "mask", "meta/id", "meta/weight"]
  assert ds.float_labels and spec["labels"].dtype == np.float32 and spec["inputs"].dtype == np.float32
  for batch, raw in zip(_train(ds), _train(_load(tfds_dir, PLAIN))):
    np.testing.assert_array_equal(batch[INDEX], raw[INDEX])
    np.testing.assert_allclose(batch["inputs"], (raw["image"] / 255 - 0.5) / 0.25, atol=1e-5)  # Normalized.
    np.testing.assert_array_equal(batch["labels"], raw["target"])  # Other features: as decoded.
    np.testing.assert_array_equal(batch["mask"], raw["mask"])


@pytest.mark.parametrize("name,fields", [(PLAIN, {}), (SUPERVISED, {"flip": True, "crop_padding": 2})])
def test_one_and_two_processes_read_the_same_global_batches_of_every_feature(tfds_dir, name, fields):
  ds = _load(tfds_dir, name, **fields)
  one, two = _global(ds, 1), _global(ds, 2)
  batches.assert_same(one, two)
  assert set(one[0]) >= {"mask", "meta/id", INDEX}


@pytest.mark.parametrize("name", [PLAIN, SUPERVISED])
def test_the_in_memory_cache_gives_the_same_batches_of_every_feature(tfds_dir, name):
  read, cached = _load(tfds_dir, name), _load(tfds_dir, name, cache_mb=64)
  assert type(cached.corpus).__name__ == "CachedCorpus" and type(read.corpus).__name__ == "TfdsCorpus"
  assert cached.element_spec() == read.element_spec()
  batches.assert_same(_train(read), _train(cached))
  evals = [list(data.eval_batches(d, "test", global_batch=B, process_index=0, process_count=1)) for d in (read, cached)]
  batches.assert_same(*evals)


@pytest.mark.parametrize("process_count", [1, 2])
def test_eval_reads_every_example_of_every_feature_once(tfds_dir, process_count):
  ds = _load(tfds_dir, PLAIN)
  seen = []
  for p in range(process_count):
    for batch in data.eval_batches(ds, "test", global_batch=B, process_index=p, process_count=process_count):
      assert sorted(batch) == sorted([*OWN, REAL])
      seen += list(batch["meta/id"][batch[REAL]])
      _assert_whole(batch)
  assert sorted(seen) == list(range(1000, 1000 + feature_datasets.NUM_TEST))


def test_the_stream_spec_names_the_features(tfds_dir):
  def spec(ds):
    return data.stream_spec(ds, "train", seed=0, global_batch=B)

  plain, supervised = spec(_load(tfds_dir, PLAIN)), spec(_load(tfds_dir, SUPERVISED))
  assert plain["features"] == sorted(OWN)
  changed = {**plain, "features": [f for f in plain["features"] if f != "mask"]}
  with pytest.raises(ConfigError, match="features"):
    data.check_resume(changed, plain)
  without = {k: v for k, v in supervised.items() if k != "features"}  # Nothing upgrades a spec that lacks the key.
  with pytest.raises(ConfigError, match="features None"):
    data.check_resume(without, supervised)


def test_a_supervised_input_that_is_a_features_dict_gives_its_features_by_name(tfds_dir):
  ds = _load(tfds_dir, "feature_datasets:NestedInputScenes")
  assert sorted(ds.element_spec()) == ["scene/image", "scene/mask", "target"]
  for batch in _train(ds, steps=2):
    np.testing.assert_array_equal(batch["scene/mask"], batch["scene/image"][..., 0] > 127)


def test_tfds_images_are_pixels_never_ids_and_never_held_while_encoded(data_dir):
  """uint8 images reach the model in the compute dtype; kept encoded (to crop), their decoded size is unknown."""
  import tensorflow_datasets as tfds
  from jaxdp.data import source
  builder = tfds.builder("digits", data_dir=data_dir)
  decoded, encoded = source.TfdsCorpus(builder), source.TfdsCorpus(builder, keep_encoded=True)
  assert (decoded.facts.image, decoded.facts.integer_inputs) == (True, False)
  assert decoded.decoded_mib() == pytest.approx(1797 * (8 * 8 * 1 + 8) / 2**20) and encoded.decoded_mib() is None


def test_sequence_labels_count_the_classes_of_their_elements(tfds_dir):
  ds = _load(tfds_dir, "feature_datasets:TaggedRows")
  assert (ds.num_classes, ds.label_shape, ds.integer_inputs) == (5, (4,), True)


def test_a_feature_named_as_a_supervised_key_is_renamed_to_is_a_config_error(tfds_dir):
  with pytest.raises(ConfigError, match="feature 'inputs' and its supervised key are both 'inputs' in a batch"):
    _load(tfds_dir, "feature_datasets:ClashingScenes")


def test_features_a_batch_cannot_stack_are_left_out_but_a_varying_input_is_kept():
  import types

  import tensorflow_datasets as tfds

  from jaxdp.data.source import FeatureNames
  features = tfds.features.FeaturesDict({
      "image": tfds.features.Image(shape=(None, None, 3)), "label": tfds.features.ClassLabel(num_classes=2),
      "boxes": tfds.features.Tensor(shape=(None, 4), dtype=np.float32), "caption": tfds.features.Text(),
      "weight": tfds.features.Tensor(shape=(), dtype=np.float32)})
  info = types.SimpleNamespace(supervised_keys=("image", "label"), features=features, full_name="scenes/1.0.0")
  names = FeatureNames(info)
  assert names.features == {"inputs": ((None, None, 3), np.dtype(np.uint8)), "labels": ((), np.dtype(np.int64)),
                            "weight": ((), np.dtype(np.float32))}
