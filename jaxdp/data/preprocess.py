"""Host-side preprocessing of whole batches: train augmentation (random crop with padding, horizontal
flip), then inputs to float32 and per-channel normalization.

Every function takes one process's rows of a global batch as numpy arrays (read, or decoded by tf.data) and uses
only vectorized ops (no per-example map), so it costs a few ops per batch. Augmentation is stateless: the draws of
global batch `step` come from one generator keyed by (seed, step) (`sampler.rng`) over all its rows, and
the example at global position `id = step * global_batch + row` takes row `row`. An example's crop and
flip therefore depend on the seed and its position only, never on which process or device gets it.
"""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from jaxdp.config import ConfigError
from jaxdp.data import sampler

INPUTS, LABELS = "inputs", "labels"  # The features preprocessing knows (a supervised dataset's).


def draws(seed: int, global_batch: int, step: int) -> np.ndarray:
  """The augmentation draws float32 [global_batch, 3] in [0, 1) of global batch `step`: row r's are example r's."""
  return sampler.rng(seed, sampler.AUGMENT, step).random((global_batch, 3), np.float32)


def batch_dtype(name: str, dtype: np.dtype) -> np.dtype:
  """A decoded feature's dtype in a host batch: inputs float32; integer labels int32 (float ones float32); any
  other 64-bit feature narrowed to 32 bits (as a device holds it), anything else as decoded."""
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
  image_size: int = 0  # Images of varying size: cropped to image_size squares (`jaxdp.data.images`); 0: off.

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
    pre._check_sizes(input_shape)
    return pre

  def _check_sizes(self, input_shape: tuple[int | None, ...]) -> None:
    """Images of varying size need image_size (then no crop_padding); fixed-size ones may use it too."""
    if not isinstance(self.image_size, int) or self.image_size < 0:
      raise ConfigError(f"dataset.image_size must be a non-negative integer, got {self.image_size!r}")
    varying = None in input_shape
    if varying and not self.image_size:
      raise ConfigError(f"the inputs vary in shape {input_shape!r}: set dataset.image_size (e.g. 224) to crop "
                        f"them to squares")
    if varying and self.crop_padding:
      raise ConfigError(f"dataset.crop_padding ({self.crop_padding}) is for fixed-size images; images of varying "
                        f"size get a random-resized crop to dataset.image_size")

  @property
  def augments(self) -> bool:
    """Whether train batches of fixed-size images are augmented per batch (varying sizes: per example)."""
    return bool(self.crop_padding or self.flip) and not self.image_size

  def affine(self, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, offset), float32 per channel: inputs of `dtype` are normalized as x * scale - offset; None: as they are.

    (x / 255 - mean) / std (uint8; else x - mean) as one multiply-add: scale = 1 / (255 std), offset = mean / std.
    The one home of the formula, applied in float32.
    """
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
    """Random crop after zero padding, then random horizontal flip; draws [rows, 3] in [0, 1).

    One gather does both: output pixel (i, j) of a row reads padded pixel (top + i, left + j), or
    (top + i, left + width - 1 - j) when the row is flipped.
    """
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
    """Inputs to float32 (uint8 scaled to [0, 1]) and normalized (`affine`, in float32); every other feature to its
    `batch_dtype`; every array contiguous. jaxdp's own keys ("_index", "_real") stay as they are."""
    out = {k: v if k == INPUTS or k.startswith("_") or v.dtype == object else
           np.ascontiguousarray(v, batch_dtype(k, v.dtype)) for k, v in batch.items()}
    if INPUTS not in batch:
      return out
    affine = self.affine(batch[INPUTS].dtype)
    if affine is None:
      return {**out, INPUTS: np.ascontiguousarray(batch[INPUTS], np.float32)}
    scale, offset = affine
    x = np.multiply(batch[INPUTS], scale, dtype=np.float32)  # Cast and scaled in one pass, into an array of its own.
    np.subtract(x, offset, out=x)
    return {**out, INPUTS: x}
