"""The built-in CNN on Fashion-MNIST (28x28 grayscale clothing; TFDS `fashion_mnist`, a download the first time)."""

import ml_collections

from jaxdp.configs import mnist

MEAN, STD = (0.2860,), (0.3530,)  # Fashion-MNIST's training-set pixel statistics, on [0, 1].


def get_config() -> ml_collections.ConfigDict:
  """The MNIST config on `fashion_mnist`, with horizontal flips (clothes are left-right symmetric)."""
  config = mnist.get_config()
  config.num_train_steps = 4000      # About 8 epochs: harder than MNIST.
  config.dataset.name = "fashion_mnist"
  config.dataset.mean = MEAN
  config.dataset.std = STD
  config.dataset.flip = True
  return config
