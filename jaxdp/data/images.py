"""Images of varying size -> fixed `image_size` squares: the ImageNet recipe, one example at a time.

Train: a random-resized ("Inception") crop, 8% to 100% of the area, aspect ratio 3/4 to 4/3 (as the
Flax ImageNet example and torchvision), resized to image_size, then a random horizontal flip. Eval: the
central square of side CROP_RATIO * min(height, width), resized. JPEGs decode only the crop window
(`decode_and_crop_jpeg`); other formats decode whole, then crop; images already decoded (arrays given from Python)
are cropped as they are and keep their dtype. The draws of an example come from a
stateless seed of (seed, step, row): its global position, never the process or device that reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxdp.data import tf_setup
from jaxdp.data.sampler import AUGMENT

if TYPE_CHECKING:  # Annotations only: TensorFlow is imported where it is used.
  import tensorflow as tf

AREA = (0.08, 1.0)
ASPECT = (3 / 4, 4 / 3)
ATTEMPTS = 10
CROP_RATIO = 0.875  # Eval: the central square's side / the shorter side (Inception's central crop: 224 of 256).
RECIPE = "inception-crop(area 0.08-1, aspect 3/4-4/3, 10 attempts)+flip; bicubic"  # In the stream spec.


def example_seed(seed: int, step: tf.Tensor, row: tf.Tensor) -> tf.Tensor:
  """A stateless seed [2] for the example at row `row` of global batch `step` (TF's: the crop is a TF op)."""
  tf = tf_setup.tensorflow()
  per_step = tf.random.experimental.stateless_fold_in(tf.constant([seed, AUGMENT], tf.int64),
                                                      tf.cast(step, tf.int64))
  return tf.random.experimental.stateless_fold_in(per_step, tf.cast(row, tf.int64))


def train_crop(image: tf.Tensor, key: tf.Tensor, image_size: int, channels: int, flip: bool) -> tf.Tensor:
  """Random-resized crop (and random flip) of one image, encoded (-> uint8) or decoded (its dtype), to
  [image_size, image_size, channels]."""
  tf = tf_setup.tensorflow()
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
  """Central square of side CROP_RATIO * min(height, width), resized to [image_size, image_size, channels] (dtype as
  in `train_crop`)."""
  tf = tf_setup.tensorflow()
  shape = _shape(image, channels)
  side = tf.cast(CROP_RATIO * tf.cast(tf.minimum(shape[0], shape[1]), tf.float32), tf.int32)
  top, left = (shape[0] - side + 1) // 2, (shape[1] - side + 1) // 2
  return _resize(_window(image, top, left, side, side, channels), image_size)


def _shape(image: tf.Tensor, channels: int) -> tf.Tensor:
  """[height, width, channels] of an image, reading only a JPEG's header."""
  tf = tf_setup.tensorflow()
  if image.dtype != tf.string:  # Already decoded.
    return tf.shape(image)
  return tf.cond(tf.io.is_jpeg(image), lambda: tf.io.extract_jpeg_shape(image),
                 lambda: tf.shape(tf.io.decode_image(image, channels, expand_animations=False)))


def _window(image: tf.Tensor, top: tf.Tensor, left: tf.Tensor, height: tf.Tensor, width: tf.Tensor,
            channels: int) -> tf.Tensor:
  """The window of an image, [height, width, channels]; JPEGs decode only that window."""
  tf = tf_setup.tensorflow()
  if image.dtype != tf.string:  # Already decoded.
    return tf.slice(image, [top, left, 0], [height, width, channels])

  def jpeg() -> tf.Tensor:
    return tf.io.decode_and_crop_jpeg(image, tf.stack([top, left, height, width]), channels=channels)

  def other() -> tf.Tensor:
    decoded = tf.io.decode_image(image, channels, expand_animations=False)
    return tf.slice(decoded, [top, left, 0], [height, width, channels])

  return tf.cond(tf.io.is_jpeg(image), jpeg, other)


def _resize(image: tf.Tensor, image_size: int) -> tf.Tensor:
  """Bicubic resize to a square, back to the image's dtype (uint8: a quarter of float32's bytes on the way to the
  device)."""
  tf = tf_setup.tensorflow()
  resized = tf.image.resize(image, [image_size, image_size], method=tf.image.ResizeMethod.BICUBIC)
  if image.dtype == tf.uint8:
    return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)
  return tf.cast(resized, image.dtype)
