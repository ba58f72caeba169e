"""The PyTorch side of experiments/e2e_compare.py: a standard torchrun DDP script for jaxdp's default config.

    python -m torch.distributed.run --nproc_per_node 2 experiments/e2e_torch.py [--steps 400] \
        [--batch_size 128] [--lr 3e-3] [--log_every 50] [--seed 0]

What a PyTorch user would write: a gloo process group, DistributedDataParallel, a DistributedSampler and a
DataLoader (its defaults: num_workers=0, no pinned memory) over in-memory tensors, `set_epoch` every epoch,
Adam, cross-entropy. The same work as `python -m jaxdp.train --config jaxdp/configs/default.py`:
- data: scikit-learn's bundled digits, split and scaled as jaxdp/datasets/digits.py does (0..16 -> uint8
  0..255 -> float32 / 255, the same 1437 train / 360 test permutation); NCHW here, NHWC in jaxdp;
- model: jaxdp's `cnn` with the default config: 3x3 convs with 32 and 64 features ('same' padding) and
  ReLU, a 2x2 average pool, dense 128 with ReLU, 10 logits (151,306 parameters);
- the global batch (128) split evenly over the ranks; Adam with the same learning rate and PyTorch's
  default betas and epsilon, which are optax's.
The one departure from the DataLoader's defaults is drop_last=True: every step is a full global batch of
`--batch_size`, as in jaxdp (11 steps per epoch), so steps and samples count the same on both sides.

Rank 0 prints one JSON line per log step, {"step": s, "time": seconds since the epoch, "loss": ...}, after
the loss of step s is on the host (CPU tensors: the step has finished), then the test accuracy at the end.
"""

import argparse
import json
import os
import sys
import time

STARTED = time.time()  # Before importing torch: time to the first step includes the imports, as jaxdp's does.

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

NUM_TEST = 360  # jaxdp/datasets/digits.py: the first 360 of a seed-0 permutation are the test split.
SPLIT_SEED = 0


def digits() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
  """{'train': (x, y), 'test': (x, y)}: float32 NCHW images in [0, 1] and int64 labels, split as jaxdp's."""
  from sklearn.datasets import load_digits
  data = load_digits()
  images = np.round(data.images * (255 / 16)).astype(np.uint8)[:, None]  # As stored by jaxdp's builder.
  order = np.random.RandomState(SPLIT_SEED).permutation(len(images))
  split = {"test": order[:NUM_TEST], "train": order[NUM_TEST:]}
  return {name: (torch.from_numpy(images[rows].astype(np.float32) / 255), torch.from_numpy(data.target[rows]).long())
          for name, rows in split.items()}


def cnn(input_shape: tuple[int, int, int] = (8, 8, 1), features: tuple[int, ...] = (32, 64), dense: int = 128,
        num_classes: int = 10) -> nn.Module:
  """jaxdp's `cnn` (jaxdp/models/cnn.py) in PyTorch: the layers of experiments/ddp_torch_worker.py."""
  h, w, c = input_shape
  chans = [c, *features]
  layers: list[nn.Module] = []
  for a, b in zip(chans, chans[1:]):
    layers += [nn.Conv2d(a, b, 3, padding=1), nn.ReLU()]
  return nn.Sequential(*layers, nn.AvgPool2d(2), nn.Flatten(), nn.Linear((h // 2) * (w // 2) * chans[-1], dense),
                       nn.ReLU(), nn.Linear(dense, num_classes))


def batches(train_set: TensorDataset, global_batch: int, rank: int, world: int,
            seed: int) -> tuple[DistributedSampler, DataLoader]:
  """This rank's sampler (call `set_epoch`) and loader of global_batch / world full rows per step."""
  sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=seed)
  return sampler, DataLoader(train_set, batch_size=global_batch // world, sampler=sampler, drop_last=True)


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog="e2e_torch.py", description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=400, help="Optimizer steps (jaxdp: num_train_steps).")
  parser.add_argument("--batch_size", type=int, default=128, help="Global batch, split evenly over the ranks.")
  parser.add_argument("--lr", type=float, default=3e-3, help="Adam's learning rate.")
  parser.add_argument("--log_every", type=int, default=50, help="Rank 0 prints a timed line every this many steps.")
  parser.add_argument("--seed", type=int, default=0, help="Seeds the parameters and the sampler's order.")
  args = parser.parse_args(argv)
  for name in ("steps", "batch_size", "log_every"):
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be positive, got {getattr(args, name)}")
  return args


def log(record: dict) -> None:
  print(json.dumps(record), flush=True)


def train(args: argparse.Namespace) -> float:
  """Trains `args.steps` steps; returns the test accuracy (rank 0; the other ranks return 0)."""
  rank, world = dist.get_rank(), dist.get_world_size()
  if args.batch_size % world:
    raise SystemExit(f"error: --batch_size {args.batch_size} is not divisible by the {world} ranks")
  data = digits()
  torch.manual_seed(args.seed)
  model = nn.parallel.DistributedDataParallel(cnn())
  optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
  loss_fn = nn.CrossEntropyLoss()
  sampler, loader = batches(TensorDataset(*data["train"]), args.batch_size, rank, world, args.seed)
  step, epoch = 0, 0
  while step < args.steps:
    sampler.set_epoch(epoch)
    for x, y in loader:
      optimizer.zero_grad(set_to_none=True)
      loss = loss_fn(model(x), y)
      loss.backward()  # DDP all-reduces the gradients (in buckets) during backward.
      optimizer.step()
      step += 1
      if rank == 0 and (step == 1 or step % args.log_every == 0 or step == args.steps):
        log({"step": step, "time": time.time(), "loss": loss.item(), "started": STARTED})
      if step == args.steps:
        break
    epoch += 1
  return evaluate(model.module, *data["test"]) if rank == 0 else 0.0


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
  """Accuracy on the whole test split."""
  model.eval()
  return (model(x).argmax(1) == y).float().mean().item()


def main(argv: list[str]) -> int:
  args = parse(argv)
  dist.init_process_group("gloo")  # torchrun sets MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE.
  try:
    accuracy = train(args)
    if dist.get_rank() == 0:
      log({"step": args.steps, "eval/accuracy": accuracy})
  finally:
    dist.destroy_process_group()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
