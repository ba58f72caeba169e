"""ResNet-50 v1.5 on ImageNet (ILSVRC 2012), Goyal et al. (2017)'s data-parallel recipe; TFDS `imagenet2012` as
ArrayRecord, whose build needs the ILSVRC tarballs in its manual_dir."""

import ml_collections

from jaxdp.configs import default

TRAIN_IMAGES = 1_281_167
STEPS_PER_EPOCH = TRAIN_IMAGES // 1024  # 1251 full global batches.
EPOCHS = 90


def get_config() -> ml_collections.ConfigDict:
  """Default config with ResNet-50 v1.5 on imagenet2012."""
  config = default.get_config()
  config.batch_size = 1024           # Global batch size (e.g. 8 devices x 128, or 32 x 32).
  config.eval_batch_size = 1000      # 50 batches cover the 50,000 validation images exactly.
  config.learning_rate = 0.1 * 1024 / 256  # 0.1 per 256 examples, scaled linearly to batch_size (change both).
  config.optimizer = "sgd"
  config.optimizer_kwargs.momentum = 0.9
  config.optimizer_kwargs.nesterov = True
  config.weight_decay = 1e-4         # L2 on the weights ...
  config.weight_decay_mask = "rank>=2"  # ... of convolutions and dense layers only: not BatchNorm, not biases.
  config.lr_schedule = "cosine"
  config.task.label_smoothing = 0.1  # Train loss against labels smoothed by 0.1 (classification's argument).
  config.warmup_steps = 5 * STEPS_PER_EPOCH
  config.num_train_steps = EPOCHS * STEPS_PER_EPOCH
  config.dtype = "bfloat16"          # Mixed precision: bfloat16 compute, float32 parameters.
  config.log_every_steps = 100
  config.eval_every_steps = 5 * STEPS_PER_EPOCH
  config.checkpoint_every_steps = STEPS_PER_EPOCH

  config.model.name = "resnet"
  config.model.stage_sizes = (3, 4, 6, 3)  # Bottleneck blocks per stage: ResNet-50.
  config.model.block = "bottleneck"        # 1x1, 3x3 (stride here: v1.5), 1x1 x4; last BN scale zero-initialised.
  config.model.stem = "imagenet"           # 7x7 stride-2 convolution and 3x3 stride-2 max-pool.
  config.model.width = 64                  # Bottleneck channels of the first stage (its output: 4x).
  config.model.bn_axis_name = "data"       # Synchronized BatchNorm: statistics over the global batch.
  config.model.bn_momentum = 0.9           # Decay of BatchNorm's running statistics.

  config.dataset.name = "imagenet2012"
  config.dataset.train_split = "train"
  config.dataset.eval_split = "validation"
  config.dataset.image_size = 224    # Train: random-resized crop to 224 x 224; eval: central crop resized to 224.
  config.dataset.flip = True         # Train: random horizontal flip.
  config.dataset.mean = (0.485, 0.456, 0.406)  # Per-channel normalization of pixels in [0, 1].
  config.dataset.std = (0.229, 0.224, 0.225)
  return config
