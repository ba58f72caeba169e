"""The built-in CNN on CIFAR-100 (32x32 colour images, 100 classes; TFDS `cifar100`, a download the first time)."""

import ml_collections

from jaxdp.configs import cifar10

MEAN = (0.5071, 0.4865, 0.4409)  # CIFAR-100 training-set per-channel mean, on [0, 1].
STD = (0.2673, 0.2564, 0.2762)   # ... and standard deviation.


def get_config() -> ml_collections.ConfigDict:
  """The CIFAR-10 recipe (crop with padding 4, flip) on `cifar100`'s fine labels."""
  config = cifar10.get_config()
  config.dataset.name = "cifar100"   # Supervised keys (image, label): the 100 fine classes.
  config.dataset.mean = MEAN
  config.dataset.std = STD
  return config
