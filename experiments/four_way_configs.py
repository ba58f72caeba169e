"""The four-way study's workloads as jaxdp configs: the one home of each model and recipe (experiments/four_way.py).

    python -m jaxdp.train --config experiments/four_way_config_mlp.py --config.dataset.name=MLP.npz ...

jaxdp's CLI reads them as any user's config file (experiments/four_way_config_NAME.py); the plain-JAX and
PyTorch workers call `get_config(name)` and train the same model with the same recipe from its fields.
Each starts from jaxdp's own config file:
  mlp     configs/mlp_digits.py: MLP 784-1024-1024-10, Adam 1e-3, global batch 1024, on a synthetic float32 .npz;
  cnn     configs/default.py, unchanged: the digits CNN, Adam 3e-3, batch 128;
  resnet  configs/cifar10_resnet18.py's ResNet-18 and SGD (Nesterov momentum, weight decay) on synthetic
          float32 32x32x3 tensors, at a batch 2 cores can step (32), constant lr, no augmentation, and
          per-replica BatchNorm statistics (what torch DDP's BatchNorm2d does);
  gpt     configs/gpt_text_file.py's 4-layer GPT (4 heads, width 128, rotary) at context 64, batch 12,
          AdamW 1e-3 (warmup 50, cosine), clip 1.0, on the 1.4 MB text of experiments/gpt_text_file.py.
"""

import argparse

import ml_collections

from jaxdp.configs import cifar10_resnet18, default, gpt_text_file, mlp_digits

NAMES = ("mlp", "cnn", "resnet", "gpt")


def get_config(name: str) -> ml_collections.ConfigDict:
  """The jaxdp config of workload `name` (the data path is set by the study: dataset.name or builder_kwargs.path)."""
  if name == "mlp":
    config = mlp_digits.get_config()
    config.model.hidden = (1024, 1024)
    config.batch_size, config.learning_rate = 1024, 1e-3
  elif name == "cnn":
    config = default.get_config()
  elif name == "resnet":
    config = cifar10_resnet18.get_config()
    config.batch_size = config.eval_batch_size = 32
    config.base_batch_size, config.learning_rate = 0, 0.1
    config.lr_schedule, config.warmup_steps = "constant", 0
    config.model.bn_axis_name = None
    config.dataset.crop_padding, config.dataset.flip, config.dataset.mean, config.dataset.std = 0, False, (), ()
  elif name == "gpt":
    config = gpt_text_file.get_config()
    config.batch_size, config.learning_rate = 12, 1e-3
    config.dataset.builder_kwargs.seq_len = 64
  else:
    raise ValueError(f"unknown workload {name!r} (choose from {', '.join(NAMES)})")
  return config


def worker_parser(prog: str, doc: str) -> argparse.ArgumentParser:
  """The flags every worker (four_way_jax.py, four_way_torch.py) takes from the driver."""
  parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
  parser.add_argument("--workload", required=True, choices=NAMES)
  parser.add_argument("--data", required=True, help="The study's .npz: x_train, y_train, x_test, y_test.")
  parser.add_argument("--steps", type=int, required=True, help="Optimizer steps (the schedule's num_train_steps).")
  parser.add_argument("--log_every", type=int, default=50,
                      help="Process (rank) 0 prints a timed line every this many steps.")
  parser.add_argument("--seed", type=int, default=None, help="Seeds init and data order (default: the config's).")
  return parser


def worker_config(args: argparse.Namespace) -> ml_collections.ConfigDict:
  """The workload's config as a worker runs it: get_config, with --seed when given."""
  config = get_config(args.workload)
  if args.seed is not None:
    config.seed = args.seed
  return config
