"""The PyTorch side of benchmarks/four_way.py: an eager loop (1 process) or a torchrun DDP script (2 processes).

    python benchmarks/four_way_torch.py --workload gpt --data ARRAYS.npz --steps 400 [--log_every 25]
    python -m torch.distributed.run --nproc_per_node 2 benchmarks/four_way_torch.py --workload mlp ...
    python benchmarks/four_way_torch.py --check   # jaxdp's GPT parameters in this GPT: the same logits?

What a PyTorch user would write for the workloads of four_way_jax.get_config, with the recipe read from the same
config: in-memory tensors (the study's .npz: x_train, y_train, x_test, y_test; NHWC images made NCHW once), a
DistributedSampler + DataLoader (`batches`: full batches of global / world rows), DistributedDataParallel over
gloo when torchrun starts several ranks, the optimizer and lr schedule of the config (optax's formulas: torch's
AdamW, Adam or SGD with Nesterov, weight decay on tensors of rank >= 2 only, LambdaLR linear warmup from 0 then
cosine to 0), gradient clipping when the config clips. Threads: torch's and torchrun's defaults (torchrun sets
OMP_NUM_THREADS=1 per rank).

Rank 0 prints JSON lines ({"step", "time", "loss"} at step 1, every --log_every steps and the last, after the
loss is on the host), then {"step", "eval/loss", "eval/accuracy"} over the whole test split (every target once,
in eval_batch_size batches).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import four_way_jax  # noqa: E402
from ml_collections import ConfigDict  # noqa: E402

STD = 0.02  # jaxdp's GPT: normal(0.02) kernels and embeddings, zero biases (flax's default bias init).
NUM_TEST = 360  # jaxdp/datasets/digits.py: the first 360 of a seed-0 permutation are the test split.


def log(record: dict) -> None:
  """One JSON line on stdout, flushed: the driver stamps its arrival."""
  print(json.dumps(record), flush=True)


def digits() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
  """{'train': (x, y), 'test': (x, y)}: float32 NCHW images in [0, 1] and int64 labels, split as jaxdp's."""
  from sklearn.datasets import load_digits
  data = load_digits()
  images = np.round(data.images * (255 / 16)).astype(np.uint8)[:, None]  # As stored by jaxdp's builder.
  order = np.random.RandomState(0).permutation(len(images))
  split = {"test": order[:NUM_TEST], "train": order[NUM_TEST:]}
  return {name: (torch.from_numpy(images[rows].astype(np.float32) / 255), torch.from_numpy(data.target[rows]).long())
          for name, rows in split.items()}


def mlp(input_shape: tuple[int, ...], hidden: tuple[int, ...], num_classes: int) -> nn.Module:
  """jaxdp's `mlp`: flatten, Linear + ReLU per hidden width, the logits."""
  widths = [math.prod(input_shape), *hidden]
  layers: list[nn.Module] = [nn.Flatten()]
  for a, b in zip(widths, widths[1:]):
    layers += [nn.Linear(a, b), nn.ReLU()]
  return nn.Sequential(*layers, nn.Linear(widths[-1], num_classes))


def cnn(input_shape: tuple[int, int, int] = (8, 8, 1), features: tuple[int, ...] = (32, 64), dense: int = 128,
        num_classes: int = 10) -> nn.Module:
  """jaxdp's `cnn`: 3x3 convs + ReLU, a 2x2 average pool, a dense layer + ReLU, the logits."""
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


def rotary(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
  """jaxdp.models.gpt.rotary: halves rotated by position-dependent angles, x [B, T, heads, head_dim]."""
  t, dim = x.shape[1], x.shape[-1]
  freqs = base ** (-torch.arange(0, dim // 2, dtype=torch.float32) * 2 / dim)
  angles = torch.arange(t, dtype=torch.float32)[:, None] * freqs[None, :]
  cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
  x1, x2 = x.chunk(2, dim=-1)
  return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
  """jaxdp's CausalSelfAttention: one qkv projection laid out [q | k | v], heads split from each, causal SDPA."""

  def __init__(self, dim: int, heads: int, out_std: float):
    super().__init__()
    self.heads = heads
    self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
    nn.init.normal_(self.qkv.weight, std=STD)
    nn.init.normal_(self.out.weight, std=out_std)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    b, t, d = x.shape
    q, k, v = self.qkv(x).view(b, t, 3 * self.heads, d // self.heads).split(self.heads, dim=2)
    q, k = rotary(q), rotary(k)
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
  """Pre-LayerNorm block (flax's LayerNorm epsilon 1e-6), tanh-approximated GELU as jax.nn.gelu's default."""

  def __init__(self, dim: int, heads: int, mlp_ratio: int, layers: int):
    super().__init__()
    out_std = STD / (2 * layers) ** 0.5  # GPT-2's scaled residual projections, as jaxdp's.
    self.ln1, self.ln2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
    self.attn = Attention(dim, heads, out_std)
    self.fc, self.proj = nn.Linear(dim, mlp_ratio * dim), nn.Linear(mlp_ratio * dim, dim)
    nn.init.normal_(self.fc.weight, std=STD)
    nn.init.normal_(self.proj.weight, std=out_std)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = x + self.attn(self.ln1(x))
    return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
  """jaxdp.models.gpt.GPT with rotary positions: token embedding, blocks, final LayerNorm, an untied head."""

  def __init__(self, vocab: int, num_layers: int, num_heads: int, embed_dim: int, mlp_ratio: int):
    super().__init__()
    self.embed = nn.Embedding(vocab, embed_dim)
    self.blocks = nn.ModuleList(Block(embed_dim, num_heads, mlp_ratio, num_layers) for _ in range(num_layers))
    self.ln_f, self.head = nn.LayerNorm(embed_dim, eps=1e-6), nn.Linear(embed_dim, vocab)
    nn.init.normal_(self.embed.weight, std=STD)
    nn.init.normal_(self.head.weight, std=STD)
    for m in self.modules():
      if isinstance(m, nn.Linear):
        nn.init.zeros_(m.bias)

  def forward(self, tokens: torch.Tensor) -> torch.Tensor:
    x = self.embed(tokens)
    for block in self.blocks:
      x = block(x)
    return self.head(self.ln_f(x))


class BasicBlock(nn.Module):
  """jaxdp's ResNet BasicBlock: 3x3 convs without bias, BatchNorm (eps 1e-5, zero-initialised last scale)."""

  def __init__(self, cin: int, cout: int, stride: int, momentum: float):
    super().__init__()
    bn = lambda: nn.BatchNorm2d(cout, eps=1e-5, momentum=1 - momentum)  # noqa: E731 (flax's decay 0.9 = torch's 0.1)
    self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), bn()
    self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), bn()
    nn.init.zeros_(self.bn2.weight)
    self.project = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), bn())
                    if stride != 1 or cin != cout else nn.Identity())

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
    return F.relu(y + self.project(x))


def resnet(config: ConfigDict, channels: int, num_classes: int) -> nn.Module:
  """jaxdp's ResNet with the CIFAR stem and basic blocks (torch's symmetric padding where flax's SAME pads after)."""
  m, width = config.bn_momentum, config.width
  layers: list[nn.Module] = [nn.Conv2d(channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width, momentum=1 - m),
                             nn.ReLU()]
  features = width
  for i, size in enumerate(config.stage_sizes):
    for j in range(size):
      layers.append(BasicBlock(features, width * 2**i, 2 if i > 0 and j == 0 else 1, m))
      features = width * 2**i
  return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(features, num_classes))


def make_model(workload: str, config: ConfigDict, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
  """The workload's model, the same layers as jaxdp's (input_shape NHWC, as in the .npz)."""
  if workload == "mlp":
    return mlp(input_shape, tuple(config.model.hidden), num_classes)
  if workload == "cnn":
    return cnn(input_shape, tuple(config.model.features) if "features" in config.model else (32, 64),
               num_classes=num_classes)
  if workload == "resnet":
    return resnet(config.model, input_shape[-1], num_classes)
  c = config.model
  return GPT(num_classes, c.num_layers, c.num_heads, c.embed_dim, c.mlp_ratio)


def lr_factor(config: ConfigDict, step: int) -> float:
  """optax's schedule of jaxdp.optim.schedule / peak: linear warmup from 0, then constant or cosine to 0."""
  warmup, total = config.warmup_steps, config.num_train_steps
  if step < warmup:
    return step / warmup
  if config.lr_schedule != "cosine":
    return 1.0
  decay = max(total, warmup + 1) - warmup
  return 0.5 * (1 + math.cos(math.pi * min(step - warmup, decay) / decay))


def optimizer(config: ConfigDict,
              model: nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
  """The config's optimizer (weight decay on tensors of rank >= 2, jaxdp's default mask) and its lr schedule."""
  params = [p for p in model.parameters() if p.requires_grad]
  wd, lr = config.weight_decay, config.learning_rate
  groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": wd},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
  if config.optimizer == "adamw":
    opt: torch.optim.Optimizer = torch.optim.AdamW(groups, lr=lr)
  elif config.optimizer == "adam":
    opt = torch.optim.Adam(groups, lr=lr)  # Coupled L2, as optax.add_decayed_weights before adam (0 here).
  elif config.optimizer == "sgd":
    opt = torch.optim.SGD(groups, lr=lr, **config.optimizer_kwargs)  # momentum, nesterov: the same names as optax's.
  else:
    raise SystemExit(f"error: the torch side has no optimizer {config.optimizer!r}")
  return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(config, step))


def tensors(arrays: np.lib.npyio.NpzFile, split: str, images: bool) -> tuple[torch.Tensor, torch.Tensor]:
  """(inputs, labels) of one split; NHWC images become NCHW (once, before training)."""
  x, y = torch.from_numpy(arrays[f"x_{split}"]), torch.from_numpy(arrays[f"y_{split}"].astype(np.int64))
  if images:
    x = x.permute(0, 3, 1, 2).contiguous()
  return (x.long() if not x.is_floating_point() else x), y


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int) -> dict[str, float]:
  """Mean cross-entropy and accuracy over every target of the split."""
  model.eval()
  loss, hits, count = 0.0, 0.0, 0
  for i in range(0, len(x), batch):
    logits = model(x[i:i + batch])
    logits, labels = logits.reshape(-1, logits.shape[-1]), y[i:i + batch].reshape(-1)
    loss += F.cross_entropy(logits, labels, reduction="sum").item()
    hits += (logits.argmax(-1) == labels).sum().item()
    count += labels.numel()
  model.train()
  return {"eval/loss": loss / count, "eval/accuracy": hits / count}


def from_jaxdp(net: GPT, params: dict) -> None:
  """Loads jaxdp's GPT parameters into `net`: the same names, flax's kernel [in, out] is torch's weight.T."""
  import jax
  state = {}
  for path, value in jax.tree_util.tree_flatten_with_path(params)[0]:
    *where, leaf = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
    value = np.asarray(value)
    state[".".join([*where, "bias" if leaf == "bias" else "weight"])] = value.T if leaf == "kernel" else value
  net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()}, strict=True)


def same_function(workload: str = "gpt") -> dict[str, float]:
  """Both GPTs on the same parameters and tokens: the largest logit difference, and the logits' scale."""
  import jax
  from jaxdp import models
  config = four_way_jax.get_config(workload)
  t = config.dataset.builder_kwargs.seq_len
  model = models.get_model(config.model, (t,), 256)
  params, model_state = model.init(jax.random.PRNGKey(1))
  tokens = np.random.default_rng(0).integers(0, 256, (2, t)).astype(np.int32)
  expected = np.asarray(model.apply(params, model_state, tokens, train=False)[0])
  c = config.model
  net = GPT(256, c.num_layers, c.num_heads, c.embed_dim, c.mlp_ratio)
  from_jaxdp(net, params)
  with torch.no_grad():
    got = net(torch.from_numpy(tokens).long()).numpy()
  return {"max_abs_logit_difference": float(np.abs(got - expected).max()),
          "max_abs_logit": float(np.abs(expected).max())}


def parse(argv: list[str]) -> argparse.Namespace:
  parser = four_way_jax.worker_parser("four_way_torch.py", __doc__)
  parser.add_argument("--num_classes", type=int, default=0, help="0: the largest train label + 1.")
  return parser.parse_args(argv)


def train(args: argparse.Namespace, rank: int, world: int) -> dict[str, float]:
  """Trains args.steps steps; returns rank 0's eval metrics (the other ranks: {})."""
  config = four_way_jax.worker_config(args)
  config.num_train_steps = args.steps
  arrays = np.load(args.data)
  images = args.workload in ("cnn", "resnet")
  x, y = tensors(arrays, "train", images)
  if len(x) < config.batch_size:  # drop_last would leave every epoch empty: no step, ever.
    raise SystemExit(f"error: {len(x)} train examples, fewer than one global batch of {config.batch_size}")
  num_classes = args.num_classes or (256 if args.workload == "gpt" else int(y.max()) + 1)
  torch.manual_seed(config.seed)
  model = make_model(args.workload, config, arrays["x_train"].shape[1:], num_classes)
  if world > 1:
    model = nn.parallel.DistributedDataParallel(model)
  opt, schedule = optimizer(config, model)
  sampler, loader = batches(TensorDataset(x, y), config.batch_size, rank, world, config.seed)
  step, epoch, clip = 0, 0, config.max_grad_norm
  while step < args.steps:
    sampler.set_epoch(epoch)
    for inputs, labels in loader:
      opt.zero_grad(set_to_none=True)
      logits = model(inputs)
      loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
      loss.backward()  # DDP all-reduces the gradients (in buckets) during backward.
      if clip:
        nn.utils.clip_grad_norm_(model.parameters(), clip)
      opt.step()
      schedule.step()
      step += 1
      if rank == 0 and (step == 1 or step % args.log_every == 0 or step == args.steps):
        log({"step": step, "time": time.time(), "loss": loss.item()})
      if step == args.steps:
        break
    epoch += 1
  if rank:
    return {}
  net = model.module if world > 1 else model
  return evaluate(net, *tensors(arrays, "test", images), config.eval_batch_size or config.batch_size)


def main(argv: list[str]) -> int:
  if argv == ["--check"]:  # Before training: is this the function jaxdp's GPT computes?
    log(same_function())
    return 0
  args = parse(argv)
  rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
  if world > 1:
    dist.init_process_group("gloo")  # torchrun sets MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE.
  try:
    metrics = train(args, rank, world)
    if rank == 0:
      log({"step": args.steps, **metrics})
  finally:
    if world > 1:
      dist.destroy_process_group()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
