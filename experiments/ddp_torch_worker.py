"""One rank of the PyTorch side of experiments/ddp_compare.py: DDP over gloo (or a plain model for 1 worker).

Started by the driver as `taskset -c RANK python experiments/ddp_torch_worker.py` with MASTER_ADDR,
MASTER_PORT, RANK and WORLD_SIZE set; one thread; commands on stdin (see ddp_common).
"""

import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_common  # noqa: E402


def make_model(name: str) -> nn.Module:
  """The same layers as jaxdp's `mlp` / `cnn` (ddp_common.MODELS), in NCHW."""
  spec = ddp_common.MODELS[name]
  h, w, c = spec["input_shape"]
  if name == "mlp":
    widths = [h * w * c, *spec["hidden"]]
    layers: list[nn.Module] = [nn.Flatten()]
    for a, b in zip(widths, widths[1:]):
      layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(widths[-1], ddp_common.NUM_CLASSES))
  chans = [c, *spec["features"]]
  layers = []
  for a, b in zip(chans, chans[1:]):
    layers += [nn.Conv2d(a, b, 3, padding=1), nn.ReLU()]
  dense = nn.Linear((h // 2) * (w // 2) * chans[-1], spec["dense"])
  return nn.Sequential(*layers, nn.AvgPool2d(2), nn.Flatten(), dense, nn.ReLU(),
                       nn.Linear(spec["dense"], ddp_common.NUM_CLASSES))


class Worker:
  """Builds each (model, batch) once and times its steps on request."""

  def __init__(self, rank: int, world: int):
    self.rank, self.world = rank, world
    self.cache: dict = {}

  def handle(self, command: dict) -> dict:
    if command["op"] == "allreduce":
      return self.allreduce(command["model"], command["steps"])
    no_sync = command.get("variant") == "no_sync"
    return {"times": self.train(command["model"], command["batch"], command["steps"], no_sync)}

  def _setup(self, name: str, batch: int) -> tuple:
    if (name, batch) not in self.cache:
      torch.manual_seed(0)
      model = make_model(name)
      if self.world > 1:
        model = nn.parallel.DistributedDataParallel(model)
      opt = torch.optim.Adam(model.parameters(), lr=ddp_common.LEARNING_RATE)
      x, y = ddp_common.local_batch(name, batch, self.rank, self.world)
      x = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW.
      self.cache[name, batch] = (model, opt, x, torch.from_numpy(y).long())
    return self.cache[name, batch]

  def train(self, name: str, batch: int, steps: int, no_sync: bool = False) -> list[float]:
    """Seconds per step; with `no_sync`, DDP's steps without their all-reduce (`model.no_sync()`)."""
    model, opt, x, y = self._setup(name, batch)
    skip = model.no_sync if no_sync else contextlib.nullcontext
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for _ in range(steps):
      start = time.perf_counter()
      opt.zero_grad(set_to_none=True)
      with skip():
        loss_fn(model(x), y).backward()  # DDP all-reduces the gradients (in buckets) during backward.
      opt.step()
      times.append(time.perf_counter() - start)
    return times

  def allreduce(self, name: str, steps: int) -> dict:
    """All-reduce (mean) of one flat float32 buffer with the model's gradient bytes, as one DDP bucket."""
    numel = sum(p.numel() for p in make_model(name).parameters())
    flat = torch.ones(numel)
    times = []
    for _ in range(steps):
      start = time.perf_counter()
      dist.all_reduce(flat)
      flat /= self.world
      times.append(time.perf_counter() - start)
    return {"times": times, "bytes": flat.numel() * flat.element_size()}


def main() -> None:
  torch.set_num_threads(1)
  torch.set_num_interop_threads(1)
  rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
  if world > 1:
    dist.init_process_group("gloo", rank=rank, world_size=world)
  ddp_common.serve(Worker(rank, world).handle)
  if world > 1:
    dist.destroy_process_group()


if __name__ == "__main__":
  main()
