"""The built-in CNN on CIFAR-10 (32x32 colour images; TFDS `cifar10`, a download the first time)."""

import ml_collections

from jaxdp.configs import default

MEAN = (0.4914, 0.4822, 0.4465)  # CIFAR-10 training-set per-channel mean, on [0, 1].
STD = (0.2470, 0.2435, 0.2616)   # ... and standard deviation.
STEPS_PER_EPOCH = 50_000 // 128  # 390 full batches of the 50,000 training images.


def get_config() -> ml_collections.ConfigDict:
  """Default config on `cifar10`: 20 epochs with augmentation."""
  config = default.get_config()
  config.batch_size = 128
  config.eval_batch_size = 1000      # 10 batches cover the 10,000 test images.
  config.num_train_steps = 20 * STEPS_PER_EPOCH
  config.learning_rate = 1e-3
  config.lr_schedule = "cosine"
  config.warmup_steps = STEPS_PER_EPOCH
  config.log_every_steps = 100
  config.eval_every_steps = 2 * STEPS_PER_EPOCH

  config.dataset.name = "cifar10"
  config.dataset.mean = MEAN
  config.dataset.std = STD
  config.dataset.crop_padding = 4
  config.dataset.flip = True
  return config
