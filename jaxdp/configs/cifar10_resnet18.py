"""ResNet-18 on CIFAR-10: SGD with Nesterov momentum and weight decay, warmup then cosine decay."""

import ml_collections

from jaxdp.configs import default

STEPS_PER_EPOCH = 50_000 // 512  # 97 full batches of CIFAR-10's 50,000 training images.


def get_config() -> ml_collections.ConfigDict:
  """Default config with ResNet-18 on cifar10."""
  config = default.get_config()
  config.batch_size = 512
  config.eval_batch_size = 1000      # 10 batches cover the 10,000 test images.
  config.learning_rate = 0.1 * 512 / 128  # 0.1 per 128 examples, scaled linearly to batch_size (change both).
  config.optimizer = "sgd"
  config.optimizer_kwargs.momentum = 0.9
  config.optimizer_kwargs.nesterov = True
  config.weight_decay = 5e-4
  config.lr_schedule = "cosine"
  config.warmup_steps = 5 * STEPS_PER_EPOCH
  config.num_train_steps = 100 * STEPS_PER_EPOCH
  config.log_every_steps = 100
  config.eval_every_steps = 5 * STEPS_PER_EPOCH

  config.model.name = "resnet"
  config.model.stage_sizes = (2, 2, 2, 2)  # Basic blocks per stage: ResNet-18.
  config.model.width = 64                  # Channels of the first stage (doubled at each later stage).
  config.model.bn_axis_name = "data"       # BatchNorm statistics averaged over all replicas; None: per replica.
  config.model.bn_momentum = 0.9           # Decay of BatchNorm's running statistics.

  config.dataset.name = "cifar10"
  config.dataset.crop_padding = 4    # Train: random 32x32 crop of the image zero-padded by 4 pixels ...
  config.dataset.flip = True         # ... and a random horizontal flip.
  config.dataset.mean = (0.4914, 0.4822, 0.4465)  # Per-channel normalization of pixels in [0, 1].
  config.dataset.std = (0.2470, 0.2435, 0.2616)
  return config
