"""The end-to-end study's parts, one process each: a step's input and a step's compute, jaxdp vs torch.

    python experiments/e2e_parts.py input jaxdp|torch [--dataset digits|PATH.npz]
    python experiments/e2e_parts.py compute jax|torch

input: wall and CPU ms per step to make process 0's 64 rows of a global batch of 128 (jaxdp's
`data.train_batches`, tfds read by index; torch's DistributedSampler + DataLoader over in-memory tensors).
compute: ms per train step (the default CNN, Adam, 64 rows of 8x8x1) with one thread: a hand-written
`jax.jit` step of jaxdp's model (XLA_FLAGS=--xla_cpu_multi_thread_eigen=false) vs torch. Numbers in
experiments/e2e_compare.md.
"""

import argparse
import os
import sys
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS, GLOBAL_BATCH, WARMUP, STEPS = 64, 128, 50, 300


def jaxdp_input(dataset: str) -> Callable[[], object]:
  from jaxdp import data
  from jaxdp.configs import default
  config = default.get_config()
  config.dataset.name = dataset
  batches = data.train_batches(data.load(config.dataset), "train", seed=0, global_batch=GLOBAL_BATCH, start_step=0,
                               process_index=0, process_count=2)
  return lambda: next(batches)


def torch_input(dataset: str) -> Callable[[], object]:
  del dataset  # Always digits: the torch script's data.
  import torch
  import e2e_torch
  torch.set_num_threads(1)
  train = e2e_torch.digits()["train"]
  sampler, loader = e2e_torch.batches(torch.utils.data.TensorDataset(*train), GLOBAL_BATCH, 0, 2, 0)

  def forever():
    epoch = 0
    while True:
      sampler.set_epoch(epoch)
      yield from loader
      epoch += 1
  batches = forever()
  return lambda: next(batches)


def jax_compute(dataset: str) -> Callable[[], object]:
  del dataset  # Synthetic rows: compute does not depend on values.
  import jax
  import numpy as np
  import optax
  from jaxdp import models
  from jaxdp.configs import default
  model = models.get_model(default.get_config().model, (8, 8, 1), 10)
  params, model_state = model.init(jax.random.PRNGKey(0))
  tx = optax.adam(3e-3)
  x = np.random.default_rng(0).random((ROWS, 8, 8, 1), dtype=np.float32)
  y = np.arange(ROWS) % 10

  @jax.jit
  def step(params, opt_state):
    def loss(p):
      logits, _ = model.apply(p, model_state, x, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  state = [params, tx.init(params)]

  def run() -> None:
    state[0], state[1], value = step(*state)
    value.block_until_ready()
  return run


def torch_compute(dataset: str) -> Callable[[], object]:
  del dataset
  import torch
  import e2e_torch
  torch.set_num_threads(1)
  net = e2e_torch.cnn()
  optimizer, loss_fn = torch.optim.Adam(net.parameters(), 3e-3), torch.nn.CrossEntropyLoss()
  x, y = torch.rand(ROWS, 1, 8, 8), torch.arange(ROWS) % 10

  def run() -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(net(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
  return run


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("part", choices=["input", "compute"])
  parser.add_argument("side", choices=["jaxdp", "jax", "torch"])
  parser.add_argument("--dataset", default="digits", help="input, jaxdp: the dataset (e.g. an .npz of the digits).")
  args = parser.parse_args(argv)
  if args.part == "compute" and args.side != "torch":
    os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false"  # Before jax is imported: one thread.
  sys.path.insert(0, HERE)
  parts = {("input", "jaxdp"): jaxdp_input, ("input", "torch"): torch_input, ("compute", "jax"): jax_compute,
           ("compute", "torch"): torch_compute}
  if (args.part, args.side) not in parts:
    parser.error(f"{args.part} runs on {' or '.join(s for p, s in parts if p == args.part)}, not {args.side}")
  step = parts[args.part, args.side](args.dataset)
  for _ in range(WARMUP):
    step()
  wall, cpu = time.perf_counter(), time.process_time()
  for _ in range(STEPS):
    step()
  wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  print(f"{args.part} {args.side}: {1e3 * wall / STEPS:.2f} ms wall, {1e3 * cpu / STEPS:.2f} ms CPU per step",
        flush=True)
  os._exit(0)  # tf.data's threads behind an endless iterator can hold the interpreter's exit for minutes.


if __name__ == "__main__":
  main(sys.argv[1:])
