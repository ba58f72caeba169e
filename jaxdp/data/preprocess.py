"""Preprocessing: per batch in numpy (augmentation, normalization), per example in TF (crops of varying-size images);
every random draw keyed by (seed, step, row in the global batch), never by the process or device reading it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import ml_collections
import numpy as np

from jaxdp.config import ConfigError
from jaxdp.data import order
from jaxdp.data.reader import tensorflow
from jaxdp.data.source import INPUTS, LABELS  # The features preprocessing knows (a supervised dataset's).

if TYPE_CHECKING:  # Annotations only: TensorFlow is imported where it is used.
  import tensorflow as tf


def draws(seed: int, global_batch: int, step: int) -> np.ndarray:
  """The augmentation draws float32 [global_batch, 3] in [0, 1) of global batch `step`: row r's are example r's."""
  return order.rng(seed, order.AUGMENT, step).random((global_batch, 3), np.float32)


def batch_dtype(name: str, dtype: np.dtype) -> np.dtype:
  """A decoded feature's dtype in a host batch: inputs float32, integer labels int32, 64-bit features 32-bit."""
  dtype = np.dtype(dtype)
  if name == INPUTS:
    return np.dtype(np.float32)
  if name == LABELS and np.issubdtype(dtype, np.integer):
    return np.dtype(np.int32)
  return {np.dtype(np.float64): np.dtype(np.float32), np.dtype(np.int64): np.dtype(np.int32),
          np.dtype(np.uint64): np.dtype(np.uint32)}.get(dtype, dtype)


@dataclasses.dataclass(frozen=True)
class Preprocess:
  """Per-dataset preprocessing from `config.dataset` (mean, std, crop_padding, flip, image_size)."""
  mean: tuple[float, ...] = ()
  std: tuple[float, ...] = ()
  crop_padding: int = 0
  flip: bool = False
  image_size: int = 0  # Images of varying size: cropped to image_size squares (`train_crop`); 0: off.
  # uint8 inputs left as uint8 by `finish`, for `scale_on_device` to finish where they are placed.
  uint8_out: bool = False

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, input_shape: tuple[int, ...]) -> "Preprocess":
    """Reads and checks the fields of a complete `config.dataset` (`config.with_defaults`) against the input shape."""
    pre = cls(tuple(config.mean), tuple(config.std), config.crop_padding, bool(config.flip), config.image_size)
    channels = input_shape[-1] if input_shape else 1
    for key, value in (("mean", pre.mean), ("std", pre.std)):
      if len(value) not in (0, 1, channels):
        raise ConfigError(f"dataset.{key} {value!r} needs 1 or {channels} values (one per channel), or none")
    if pre.std and min(pre.std) <= 0:
      raise ConfigError(f"dataset.std must be positive, got {pre.std!r}")
    if not isinstance(pre.crop_padding, int) or pre.crop_padding < 0:
      raise ConfigError(f"dataset.crop_padding must be a non-negative integer, got {pre.crop_padding!r}")
    if (pre.crop_padding or pre.flip or pre.image_size) and len(input_shape) != 3:
      raise ConfigError(f"dataset.crop_padding / dataset.flip / dataset.image_size need images (height, width, "
                        f"channels); the inputs have shape {input_shape!r}")
    if not isinstance(pre.image_size, int) or pre.image_size < 0:
      raise ConfigError(f"dataset.image_size must be a non-negative integer, got {pre.image_size!r}")
    # Images of varying size need image_size (then no crop_padding); fixed-size ones may use it too.
    if None in input_shape and not pre.image_size:
      raise ConfigError(f"the inputs vary in shape {input_shape!r}: set dataset.image_size (e.g. 224) to crop "
                        f"them to squares")
    if None in input_shape and pre.crop_padding:
      raise ConfigError(f"dataset.crop_padding ({pre.crop_padding}) is for fixed-size images; images of varying "
                        f"size get a random-resized crop to dataset.image_size")
    return pre

  @property
  def augments(self) -> bool:
    """Whether train batches of fixed-size images are augmented per batch (varying sizes: per example)."""
    return bool(self.crop_padding or self.flip) and not self.image_size

  def affine(self, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, offset) per channel: x * scale - offset is (x [/ 255 for uint8] - mean) / std; None: nothing to do."""
    scale = 1 / 255 if np.dtype(dtype) == np.uint8 else 1.0
    if not (self.mean or self.std or scale != 1.0):
      return None
    std = np.asarray(self.std or (1.0,), np.float32)
    mean = np.asarray(self.mean or (0.0,), np.float32)
    return np.float32(scale) / std, mean / std

  def train(self, batch: dict[str, np.ndarray], step: int, *, seed: int, global_batch: int,
            first_row: int) -> dict[str, np.ndarray]:
    """Augments then finishes rows [first_row, first_row + rows) of global batch `step`."""
    if INPUTS not in batch:  # A dataset without supervised keys: nothing to augment (its options say so).
      return self.finish(batch)
    x = batch[INPUTS]
    if self.augments:
      x = self.augment(x, draws(seed, global_batch, step)[first_row:first_row + len(x)])
    return self.finish({**batch, INPUTS: x})

  def augment(self, images: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """Random crop after zero padding, then random flip (draws [rows, 3] in [0, 1)), in one gather."""
    rows, height, width, channels = images.shape
    pad = self.crop_padding
    top = (draws[:, 0] * np.float32(2 * pad + 1)).astype(np.int32)
    left = (draws[:, 1] * np.float32(2 * pad + 1)).astype(np.int32)
    j = np.arange(width, dtype=np.int32)[None, :]
    cols = left[:, None] + (np.where((draws[:, 2] < 0.5)[:, None], width - 1 - j, j) if self.flip else j)
    ys = top[:, None] + np.arange(height, dtype=np.int32)[None, :]
    padded = np.pad(images, [(0, 0), (pad, pad), (pad, pad), (0, 0)]) if pad else images
    return padded[np.arange(rows)[:, None, None], ys[:, :, None], cols[:, None, :]]

  def finish(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inputs to float32, normalized (`affine`; uint8 ones kept with `uint8_out`); other features to their
    `batch_dtype` (jaxdp's "_" keys kept)."""
    out = {k: v if k == INPUTS or k.startswith("_") or v.dtype == object else
           np.ascontiguousarray(v, batch_dtype(k, v.dtype)) for k, v in batch.items()}
    if INPUTS not in batch:
      return out
    if self.uint8_out and batch[INPUTS].dtype == np.uint8:
      return {**out, INPUTS: np.ascontiguousarray(batch[INPUTS])}
    affine = self.affine(batch[INPUTS].dtype)
    if affine is None:
      return {**out, INPUTS: np.ascontiguousarray(batch[INPUTS], np.float32)}
    scale, offset = affine
    x = np.multiply(batch[INPUTS], scale, dtype=np.float32)  # Cast and scaled in one pass, into an array of its own.
    np.subtract(x, offset, out=x)
    return {**out, INPUTS: x}


def scale_on_device(pre: Preprocess) -> Callable[[dict[str, jax.Array]], dict[str, jax.Array]]:
  """A jitted `finish` of placed batches whose inputs `pre.finish` kept uint8 (`uint8_out`), on the devices: each
  value looked up in the host's own `finish` of all 256 values, so the bits are the host's on any backend (XLA fuses
  x * scale - offset into one multiply-add, rounded once). Any other input passes through."""
  host = dataclasses.replace(pre, uint8_out=False)

  @jax.jit
  def scaled(x: jax.Array) -> jax.Array:
    width = x.shape[-1]  # Broadcast against the last axis, as numpy broadcasts (scale, offset).
    values = np.broadcast_to(np.arange(256, dtype=np.uint8)[:, None], (256, width))
    table = jax.numpy.asarray(host.finish({INPUTS: values})[INPUTS].ravel())
    return table[x.astype(np.int32) * width + np.arange(width, dtype=np.int32)]

  def finish(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    x = batch.get(INPUTS)
    return batch if x is None or x.dtype != np.uint8 else {**batch, INPUTS: scaled(x)}

  return finish


# The random-resized ("Inception") crop of the Flax ImageNet example and torchvision.
AREA = (0.08, 1.0)
ASPECT = (3 / 4, 4 / 3)
ATTEMPTS = 10
CROP_RATIO = 0.875  # Eval: the central square's side / the shorter side (Inception's central crop: 224 of 256).
RECIPE = "inception-crop(area 0.08-1, aspect 3/4-4/3, 10 attempts)+flip; bicubic"  # In the stream spec.


def example_seed(seed: int, step: tf.Tensor, row: tf.Tensor) -> tf.Tensor:
  """A stateless seed [2] for the example at row `row` of global batch `step` (TF's: the crop is a TF op)."""
  tf = tensorflow()
  per_step = tf.random.experimental.stateless_fold_in(tf.constant([seed, order.AUGMENT], tf.int64),
                                                      tf.cast(step, tf.int64))
  return tf.random.experimental.stateless_fold_in(per_step, tf.cast(row, tf.int64))


def train_crop(image: tf.Tensor, key: tf.Tensor, image_size: int, channels: int, flip: bool) -> tf.Tensor:
  """Random-resized crop (and random flip) of one image, encoded or decoded, to [image_size, image_size, channels]."""
  tf = tensorflow()
  crop_key, flip_key = tf.unstack(tf.random.experimental.stateless_split(key, 2))
  shape = _shape(image, channels)
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      shape, tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]), seed=crop_key, min_object_covered=0.1,
      aspect_ratio_range=ASPECT, area_range=AREA, max_attempts=ATTEMPTS, use_image_if_no_bounding_boxes=True)
  crop = _resize(_window(image, begin[0], begin[1], size[0], size[1], channels), image_size)
  if not flip:
    return crop
  return tf.cond(tf.random.stateless_uniform([], flip_key) < 0.5, lambda: tf.reverse(crop, [1]), lambda: crop)


def eval_crop(image: tf.Tensor, image_size: int, channels: int) -> tf.Tensor:
  """Central square of side CROP_RATIO * min(height, width), resized to [image_size, image_size, channels]."""
  tf = tensorflow()
  shape = _shape(image, channels)
  side = tf.cast(CROP_RATIO * tf.cast(tf.minimum(shape[0], shape[1]), tf.float32), tf.int32)
  top, left = (shape[0] - side + 1) // 2, (shape[1] - side + 1) // 2
  return _resize(_window(image, top, left, side, side, channels), image_size)


def _shape(image: tf.Tensor, channels: int) -> tf.Tensor:
  """[height, width, channels] of an image, reading only a JPEG's header."""
  tf = tensorflow()
  if image.dtype != tf.string:  # Already decoded.
    return tf.shape(image)
  return tf.cond(tf.io.is_jpeg(image), lambda: tf.io.extract_jpeg_shape(image),
                 lambda: tf.shape(tf.io.decode_image(image, channels, expand_animations=False)))


def _window(image: tf.Tensor, top: tf.Tensor, left: tf.Tensor, height: tf.Tensor, width: tf.Tensor,
            channels: int) -> tf.Tensor:
  """The window of an image, [height, width, channels]; JPEGs decode only that window."""
  tf = tensorflow()
  if image.dtype != tf.string:  # Already decoded.
    return tf.slice(image, [top, left, 0], [height, width, channels])

  def jpeg() -> tf.Tensor:
    return tf.io.decode_and_crop_jpeg(image, tf.stack([top, left, height, width]), channels=channels)

  def other() -> tf.Tensor:
    decoded = tf.io.decode_image(image, channels, expand_animations=False)
    return tf.slice(decoded, [top, left, 0], [height, width, channels])

  return tf.cond(tf.io.is_jpeg(image), jpeg, other)


def _resize(image: tf.Tensor, image_size: int) -> tf.Tensor:
  """Bicubic resize to a square, back to the image's dtype (uint8: a quarter of float32's bytes to the device)."""
  tf = tensorflow()
  resized = tf.image.resize(image, [image_size, image_size], method=tf.image.ResizeMethod.BICUBIC)
  if image.dtype == tf.uint8:
    return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)
  return tf.cast(resized, image.dtype)
