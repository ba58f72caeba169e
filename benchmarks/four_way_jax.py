"""The four-way study's workloads and its plain-JAX side: a hand-written jit step with optax over numpy batches.

    python benchmarks/four_way_jax.py --workload gpt --data ARRAYS.npz --steps 400 [--log_every 25] \
        [--num_processes 2]
    FOUR_WAY_WORKLOAD=mlp python -m jaxdp.train --config benchmarks/four_way_jax.py ...   # Through jaxdp's CLI.

`get_config(name)` is the one home of each workload's model and recipe, read by every side (jaxdp's CLI calls it
without a name: the workload is then $FOUR_WAY_WORKLOAD); each starts from jaxdp's own config file:
  mlp     configs/mlp_digits.py: MLP 784-1024-1024-10, Adam 1e-3, global batch 1024, on a synthetic float32 .npz;
  cnn     configs/default.py, unchanged: the digits CNN, Adam 3e-3, batch 128;
  resnet  configs/cifar10_resnet18.py's ResNet-18 and SGD (Nesterov momentum, weight decay) on synthetic
          float32 32x32x3 tensors at batch 32, constant lr, no augmentation, per-replica BatchNorm statistics;
  gpt     configs/gpt_text_file.py's 4-layer GPT (4 heads, width 128, rotary) at context 64, batch 12,
          AdamW 1e-3 (warmup 50, cosine), clip 1.0, on 1.4 MB of Python's documentation (four_way.py writes it).

What a JAX user would write without jaxdp's loop: the workload's model from jaxdp.models (flax nnx layers, as a
user writes them), the config's optimizer written out in optax, one `jax.jit` step (value_and_grad, optax update,
the state donated), numpy batches gathered from the in-memory .npz each step (one shuffled order per epoch, full
global batches), no prefetch but JAX's asynchronous dispatch, the loss read on the host at log steps only. With
--num_processes N this process starts N - 1 peers of itself, each joins with `jax.distributed.initialize` (one
CPU device each, gloo), and the step is a shard_map over the mesh whose gradients, loss and BatchNorm statistics
are pmean'd, raveled into one buffer (--allreduce flat: one gloo call; `tree`: one all-reduce per leaf); each
process gathers its own rows of the global batch. XLA's and JAX's defaults otherwise (threads, flags).

Process 0 prints JSON lines ({"step", "time", "loss"}) and at the end {"step", "eval/loss", "eval/accuracy"}
over the whole test split, evaluated locally on its own device.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

import ml_collections

from jaxdp.configs import cifar10_resnet18, default, gpt_text_file, mlp_digits

NAMES = ("mlp", "cnn", "resnet", "gpt")
WORKLOAD_VAR = "FOUR_WAY_WORKLOAD"  # get_config()'s workload when jaxdp's CLI loads this file as its config.


def get_config(name: str = "") -> ml_collections.ConfigDict:
  """The jaxdp config of workload `name` (default: $FOUR_WAY_WORKLOAD; the study sets the data path)."""
  name = name or os.environ.get(WORKLOAD_VAR, "")
  if name == "mlp":
    config = mlp_digits.get_config()
    config.model.hidden = (1024, 1024)
    config.batch_size, config.learning_rate = 1024, 1e-3
  elif name == "cnn":
    config = default.get_config()
  elif name == "resnet":
    config = cifar10_resnet18.get_config()
    config.batch_size = config.eval_batch_size = 32
    config.learning_rate = 0.1
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


def parse(argv: list[str]) -> argparse.Namespace:
  parser = worker_parser("four_way_jax.py", __doc__)
  parser.add_argument("--num_processes", type=int, default=1, help="Processes (this one starts the others).")
  parser.add_argument("--process_id", type=int, default=0, help="Set on the peers this process starts.")
  parser.add_argument("--coordinator", default="", help="host:port of process 0 (set on the peers).")
  parser.add_argument("--allreduce", choices=("flat", "tree"), default="flat",
                      help="Several processes: pmean one raveled buffer (flat) or the tree, leaf by leaf.")
  return parser.parse_args(argv)


def tx_of(config):
  """The config's optimizer in optax (jaxdp.optim's recipe: decay on rank >= 2 tensors, warmup then cosine)."""
  import jax
  import optax
  lr, warmup, total = config.learning_rate, config.warmup_steps, config.num_train_steps
  if config.lr_schedule == "cosine":
    lr = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total, warmup + 1))
  elif warmup:
    lr = optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)], [warmup])
  mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
  wd = config.weight_decay
  if config.optimizer == "adamw":
    tx = optax.adamw(lr, weight_decay=wd, mask=mask)
  elif config.optimizer == "adam":
    tx = optax.adam(lr)
  elif config.optimizer == "sgd":
    tx = optax.sgd(lr, **config.optimizer_kwargs)
  else:
    raise SystemExit(f"error: the plain-JAX side has no optimizer {config.optimizer!r}")
  if wd and config.optimizer != "adamw":
    tx = optax.chain(optax.add_decayed_weights(wd, mask), tx)
  return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), tx) if config.max_grad_norm else tx


def start_peers(argv: list[str], count: int) -> tuple[str, list[subprocess.Popen]]:
  """Starts processes 1..count-1 of this script; returns the coordinator address and the peers."""
  from jaxdp.tools.launch import free_port  # A free port: the one helper taken from jaxdp, not part of the loop.
  address = f"127.0.0.1:{free_port()}"
  peers = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv, "--process_id", str(i),
                             "--coordinator", address], stdout=subprocess.DEVNULL) for i in range(1, count)]
  return address, peers


def loss_of(model) -> Callable:
  """`loss_fn(params, model_state, inputs, labels) -> (mean cross-entropy, model_state)`: the study's train loss."""
  import jax.numpy as jnp
  import optax

  def loss_fn(params, model_state, inputs, labels):
    logits, model_state = model.apply(params, model_state, inputs, train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean(), model_state
  return loss_fn


def train(args: argparse.Namespace) -> dict[str, float]:
  """Trains args.steps steps; returns process 0's eval metrics (the others: {})."""
  import jax
  import jax.numpy as jnp
  import optax
  from jax import lax
  from jax.flatten_util import ravel_pytree
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  from jaxdp import models

  n, pid = args.num_processes, args.process_id
  if n > 1:
    jax.distributed.initialize(args.coordinator, n, pid)
  config = worker_config(args)
  config.num_train_steps = args.steps
  with np.load(args.data) as f:
    arrays = {k: f[k] for k in f.files}
  x, y = arrays["x_train"], arrays["y_train"]
  if len(x) < config.batch_size:
    raise SystemExit(f"error: {len(x)} train examples, fewer than one global batch of {config.batch_size}")
  num_classes = 256 if args.workload == "gpt" else int(y.max()) + 1
  model = models.get_model(config.model, x.shape[1:], num_classes)
  tx = tx_of(config)
  axis = "data" if n > 1 else None

  loss_fn = loss_of(model)

  def step(state, inputs, labels):
    params, model_state, opt_state = state
    (loss, model_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, model_state, inputs, labels)
    if axis:  # Every replica applies the mean gradient; per-replica BatchNorm statistics averaged, as jaxdp.
      reduced = (grads, loss, model_state)
      if args.allreduce == "flat":  # One buffer, one collective (what jaxdp's flat all-reduce does on CPU).
        flat, unravel = ravel_pytree(reduced)
        grads, loss, model_state = unravel(lax.pmean(flat, axis))
      else:  # One all-reduce per leaf: XLA:CPU does not combine them, and each is a gloo round trip.
        grads, loss, model_state = lax.pmean(reduced, axis)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), model_state, opt_state), loss

  def init(key):
    params, model_state = model.init(key)
    return params, model_state, tx.init(params)

  key = jax.random.PRNGKey(config.seed)
  if n > 1:
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated, by_row = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    state = jax.jit(init, out_shardings=replicated)(key)
    step_fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P())),
                      donate_argnums=0)
    put = lambda a: jax.make_array_from_process_local_data(by_row, a)  # noqa: E731
  else:
    state, step_fn, put = jax.jit(init)(key), jax.jit(step, donate_argnums=0), jax.device_put
  batch, local = config.batch_size, config.batch_size // n
  rows = rows_of(len(x), batch, config.seed)
  for s in range(1, args.steps + 1):
    mine = rows(s - 1, pid * local, (pid + 1) * local)
    state, loss = step_fn(state, put(x[mine]), put(y[mine]))
    if pid == 0 and (s == 1 or s % args.log_every == 0 or s == args.steps):
      value = float(np.asarray(loss.addressable_data(0)))  # Waits for the step: its loss is on the host.
      print(json.dumps({"step": s, "time": time.time(), "loss": value}), flush=True)
  metrics = {} if pid else evaluate(model, jax.tree.map(lambda a: a.addressable_data(0), state[:2]), arrays["x_test"],
                                    arrays["y_test"], config.eval_batch_size or batch)
  if n > 1:  # Now, not at exit: process 0's exit waits for its peers, whose exit would wait here for it.
    jax.distributed.shutdown()
  return metrics


def rows_of(n: int, batch: int, seed: int) -> Callable[[int, int, int], np.ndarray]:
  """`rows(step, lo, hi)`: the example indices of rows [lo, hi) of global batch `step` (0-based): numpy's
  permutation per epoch from default_rng(seed), full global batches only, as every side."""
  rng, per_epoch, held = np.random.default_rng(seed), n // batch, [-1, np.zeros(0, np.int64)]  # [epoch, its order]

  def rows(step: int, lo: int, hi: int) -> np.ndarray:
    epoch, k = divmod(step, per_epoch)
    if epoch < held[0]:
      raise ValueError(f"the plain order is read in step order: step {step} is in epoch {epoch} < {held[0]}")
    while held[0] < epoch:  # One permutation per epoch reached, drawn in turn: the loop's order.
      held[:] = [held[0] + 1, rng.permutation(n)]
    return held[1][k * batch + lo:k * batch + hi]
  return rows


def evaluate(model, variables, x: np.ndarray, y: np.ndarray, batch: int) -> dict[str, float]:
  """Mean cross-entropy and accuracy over every target of the split, on this process's device."""
  import jax
  import jax.numpy as jnp
  import optax

  @jax.jit
  def sums(params, model_state, inputs, labels):
    logits = model.apply(params, model_state, inputs, train=False)[0].astype(jnp.float32)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return loss.sum(), (jnp.argmax(logits, -1) == labels).sum()

  loss, hits = 0.0, 0
  for i in range(0, len(x), batch):
    a, b = sums(*variables, x[i:i + batch], y[i:i + batch])
    loss, hits = loss + float(a), hits + int(b)
  return {"eval/loss": loss / y.size, "eval/accuracy": hits / y.size}


def main(argv: list[str]) -> int:
  args = parse(argv)
  peers = []
  if args.num_processes > 1 and not args.coordinator:
    args.coordinator, peers = start_peers(argv, args.num_processes)
  try:
    metrics = train(args)
  except BaseException:
    for peer in peers:  # Without this process (the coordinator) they would wait for its heartbeat.
      peer.kill()
    raise
  if args.process_id == 0:
    print(json.dumps({"step": args.steps, **metrics}), flush=True)
  for i, peer in enumerate(peers, 1):
    if peer.wait(timeout=120):
      raise SystemExit(f"error: process {i} exited with status {peer.returncode}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
