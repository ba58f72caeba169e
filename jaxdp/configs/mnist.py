"""The built-in CNN on MNIST (28x28 grayscale digits; TFDS `mnist`, a download the first time)."""

import ml_collections

from jaxdp.configs import default

MEAN, STD = (0.1307,), (0.3081,)  # MNIST's training-set pixel statistics, on [0, 1].


def get_config() -> ml_collections.ConfigDict:
  """Default config on `mnist`: about 4 epochs of the 60,000 training images."""
  config = default.get_config()
  config.batch_size = 128
  config.eval_batch_size = 1000      # 10 batches cover the 10,000 test images.
  config.num_train_steps = 2000
  config.learning_rate = 1e-3
  config.lr_schedule = "cosine"
  config.warmup_steps = 100
  config.log_every_steps = 100
  config.eval_every_steps = 500

  config.dataset.name = "mnist"
  config.dataset.mean = MEAN
  config.dataset.std = STD
  return config
