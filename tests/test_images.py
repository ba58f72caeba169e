"""Images of varying size: the ImageNet crops (keyed by global position), a generated JPEG dataset trained end
to end on 8 devices, and the ResNet-50 v1.5 config stepping on it."""

import itertools

import jax
import ml_collections
import numpy as np
import pytest
import tensorflow as tf
from flax import nnx

import jpeg_dataset  # noqa: F401  Registers "varsize_jpegs".
import runs
from jaxdp import data, train
from jaxdp.batch import REAL
from jaxdp.config import ConfigError
from jaxdp.configs import imagenet2012_resnet50
from jaxdp.data import preprocess as images
from jaxdp.models.resnet import Bottleneck, ResNet

SIZE = 16


@pytest.fixture
def half_crop(monkeypatch):
  """The eval crop's side at half the shorter side (its constant is 0.875), so that crops land on whole pixels."""
  monkeypatch.setattr(images, "CROP_RATIO", 0.5)


@pytest.fixture(scope="module")
def jpeg_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("jpegs"))
  data.load(ml_collections.ConfigDict({"name": "varsize_jpegs", "data_dir": path, "image_size": SIZE}))
  return path


def _load(jpeg_dir, **fields):
  return data.load(ml_collections.ConfigDict({"name": "varsize_jpegs", "data_dir": jpeg_dir, "image_size": SIZE,
                                              "flip": True, **fields}))


def _global(ds, steps, process_count, start=0, batch=16):
  per = [list(itertools.islice(data.train_batches(ds, "train", seed=0, global_batch=batch, start_step=start,
                                                  process_index=p, process_count=process_count), steps))
         for p in range(process_count)]
  return [{k: np.concatenate([pp[s][k] for pp in per]) for k in per[0][s]} for s in range(steps)]


def _field(height, width):
  """An image whose pixel (i, j) encodes its position, as PNG (lossless) and JPEG bytes."""
  i, j = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
  image = np.stack([i * 3 % 256, j * 3 % 256, (i + j) % 256], -1).astype(np.uint8)
  return image, tf.io.encode_png(image), tf.io.encode_jpeg(image, quality=95)


def test_eval_crop_is_the_central_square(half_crop):
  image, png, jpeg = _field(40, 60)
  out = images.eval_crop(png, 20, 3).numpy()  # The central 20 x 20 of 40 x 60, resized to 20: unchanged.
  np.testing.assert_array_equal(out, image[10:30, 20:40])
  # JPEG: decode_and_crop_jpeg is decode, then crop, up to chroma upsampling at the window's edge.
  window = images.eval_crop(jpeg, 20, 3).numpy().astype(int)
  diff = np.abs(window - tf.io.decode_jpeg(jpeg).numpy()[10:30, 20:40])
  assert diff.max() <= 2 and (diff == 0).mean() > 0.95


def test_eval_crop_puts_the_odd_margin_pixel_before_the_crop(half_crop):
  image, png, _ = _field(41, 61)
  # side = int(0.5 * 41) = 20: margins of 21 rows and 41 columns; the extra pixel goes before the crop.
  out = images.eval_crop(png, 20, 3).numpy()
  np.testing.assert_array_equal(out, image[11:31, 21:41])


def test_train_crop_is_keyed_by_position_and_varies():
  _, png, jpeg = _field(48, 64)
  for encoded in (png, jpeg):
    crops = {pos: images.train_crop(encoded, images.example_seed(0, *pos), SIZE, 3, True).numpy()
             for pos in [(0, 0), (0, 1), (1, 0), (7, 3)]}
    again = images.train_crop(encoded, images.example_seed(0, 7, 3), SIZE, 3, True).numpy()
    np.testing.assert_array_equal(crops[(7, 3)], again)
    assert all(c.shape == (SIZE, SIZE, 3) and c.dtype == np.uint8 for c in crops.values())
    assert len({c.tobytes() for c in crops.values()}) == 4
  other_seed = images.train_crop(png, images.example_seed(1, 7, 3), SIZE, 3, True).numpy()
  assert not np.array_equal(other_seed, crops[(7, 3)])


def test_decoded_images_crop_as_their_png_does_and_keep_their_dtype(half_crop):
  image, png, _ = _field(48, 64)
  keys = [images.example_seed(0, *pos) for pos in [(0, 0), (7, 3)]]
  for key in keys:
    np.testing.assert_array_equal(images.train_crop(tf.constant(image), key, SIZE, 3, True).numpy(),
                                  images.train_crop(png, key, SIZE, 3, True).numpy())
  np.testing.assert_array_equal(images.eval_crop(tf.constant(image), 20, 3).numpy(),
                                images.eval_crop(png, 20, 3).numpy())
  as_float = images.eval_crop(tf.constant(image / 255, tf.float32), 20, 3)  # Resized 24 -> 20: interpolated.
  assert as_float.dtype == tf.float32 and 0 < float(tf.reduce_max(as_float)) <= 1.01


def test_arrays_from_python_train_and_evaluate_with_image_size(tmp_path):
  rng = np.random.RandomState(0)
  arrays = {"inputs": rng.randint(0, 256, (96, 20, 28, 3)).astype(np.uint8), "labels": np.arange(96) % 3}
  config = runs.config_with({"dataset.image_size": SIZE, "dataset.flip": True, "model.name": "mlp",
                             "num_train_steps": 3, "eval_every_steps": 3, "batch_size": 16})
  result = train.train_and_evaluate(config, str(tmp_path), train_data=arrays, eval_data=arrays)
  assert result.eval_metrics["eval/num_examples"] == 96
  assert result.params["hidden"][0]["kernel"].shape[0] == SIZE * SIZE * 3  # The model saw the crops.


def test_varying_sizes_need_image_size(jpeg_dir):
  with pytest.raises(ConfigError, match=r"vary in shape .*set dataset.image_size"):
    data.load(ml_collections.ConfigDict({"name": "varsize_jpegs", "data_dir": jpeg_dir}))


def test_variable_size_stream_is_process_count_invariant_and_resumable(jpeg_dir):
  ds = _load(jpeg_dir)
  assert ds.input_shape == (SIZE, SIZE, 3)
  straight = _global(ds, 5, 1)  # Crosses the epoch boundary (4 steps of 16 per epoch).
  assert straight[0]["inputs"].shape == (16, SIZE, SIZE, 3) and straight[0]["inputs"].dtype == np.float32
  runs.assert_bitwise(straight, _global(ds, 5, 4))
  runs.assert_bitwise(straight[3:], _global(ds, 2, 2, start=3))
  evals = [list(data.eval_batches(ds, "test", global_batch=16, process_index=p, process_count=2)) for p in range(2)]
  assert sum(int(b[REAL].sum()) for per in evals for b in per) == 20


def test_variable_size_jpegs_train_end_to_end_on_eight_devices(jpeg_dir, tmp_path):
  config = runs.config_with({"dataset.name": "varsize_jpegs", "dataset.data_dir": jpeg_dir, "dataset.image_size": SIZE,
                             "dataset.flip": True, "batch_size": 16, "num_train_steps": 4, "log_every_steps": 2,
                             "eval_every_steps": 4, "checkpoint_every_steps": 0})
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result.eval_metrics["eval/num_examples"] == 20
  assert int(result.backend.get(result.state.step)) == 4
  assert np.isfinite(result.eval_metrics["eval/loss"])


def test_imagenet_resnet50_config_builds_and_steps(jpeg_dir, tmp_path):
  config = imagenet2012_resnet50.get_config()
  runs.override(config, {"dataset.name": "varsize_jpegs", "dataset.data_dir": jpeg_dir, "dataset.eval_split": "test",
                         "dataset.image_size": SIZE, "batch_size": 16, "eval_batch_size": 16, "num_train_steps": 2,
                         "warmup_steps": 1, "log_every_steps": 1, "eval_every_steps": 2, "checkpoint_every_steps": 0,
                         "model.width": 4, "parallel.num_devices": 2,
                         "model.stage_sizes": (1,)})  # One bottleneck block compiles in 16 s, four in 35 s (2 cores);
  # the full ResNet-50 is checked by shape below, and 8 devices by the other tests.
  result = train.train_and_evaluate(config, str(tmp_path))
  assert int(result.backend.get(result.state.step)) == 2
  assert np.isfinite(result.eval_metrics["eval/loss"]) and result.eval_metrics["eval/num_examples"] == 20


def test_resnet50_is_the_v1_5_architecture():
  model = nnx.eval_shape(lambda: ResNet((224, 224, 3), 1000, (3, 4, 6, 3), block="bottleneck", stem="imagenet",
                                        rngs=nnx.Rngs(0)))
  assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == 25_557_032  # torchvision's count.
  first = model.blocks[3]  # The first block of stage 2: the stride sits on the 3x3 convolution (v1.5).
  assert first.conv2.strides == 2 and first.conv1.strides == 1 and first.project.strides == 2
  block = Bottleneck(8, 4, 1, None, 0.9, rngs=nnx.Rngs(0))  # Starts as the identity: the last BN scale is zero.
  assert block.bn3.scale[...].shape == (16,) and not np.any(block.bn3.scale[...])
  assert np.all(block.bn2.scale[...] == 1)


def test_train_flip_mirrors_some_crops_and_only_mirrors():
  _, png, _ = _field(48, 64)
  mirrored = 0
  for row in range(8):
    key = images.example_seed(0, 0, row)
    flipped, plain = (images.train_crop(png, key, SIZE, 3, flip).numpy() for flip in (True, False))
    if not np.array_equal(flipped, plain):
      np.testing.assert_array_equal(flipped, plain[:, ::-1])  # The same crop, mirrored.
      mirrored += 1
  assert 0 < mirrored < 8
