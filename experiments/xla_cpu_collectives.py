"""Where the gradient all-reduce's time goes on XLA:CPU (gloo), next to torch.distributed's, in the same processes.

    python experiments/xla_cpu_collectives.py [--rounds 9] [--repeats 10] [--out experiments/xla_cpu_collectives.md] \
        [--xla_flags '--xla_cpu_multi_thread_eigen=false']

Starts 2 processes (one CPU device and one compute thread each) that join both `jax.distributed` and
`torch.distributed` (gloo, 127.0.0.1) and time, alternating in every round, on the MLP of ddp_compare's gradient
shapes (7,454,760 bytes):
- `torch all_reduce`: `dist.all_reduce` of one flat float32 tensor (one DDP bucket);
- `jax psum, flat`: a jitted psum of one flat buffer (the collective alone);
- `jaxdp flat mean`: `strategies.plain.flat_all_reduce_mean` of the gradient tree (what jaxdp's step does:
  concatenate, one psum, divide and cut back into leaves);
- `concatenate, 1-D` and `concatenate, one row`: the copy into one buffer alone, of raveled leaves (XLA:CPU
  fuses it into one loop over a tree of operand bounds) or of (1, n) rows along the minor axis (left unfused:
  one block copy per leaf), as `flat_all_reduce_mean` does now;
- `compute`, `psum + compute`: an independent matmul chain alone and in one program with the psum (does XLA:CPU
  overlap a collective with compute, as DDP overlaps its bucket all-reduces with the backward pass?);
- `psum, compute: two programs`: the psum and the matmul chain as two jitted programs dispatched together
  (does the runtime run independent programs at once?).
Prints `median (min..max)` in ms over rounds (rank 0, `abrun.fmt`), as a Markdown table.
"""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402

SHAPES = [(784, 1024), (1024,), (1024, 1024), (1024,), (1024, 10), (10,)]  # ddp_compare's MLP: 1,863,690 floats.


def _programs():
  """name -> (jitted function, its arguments), all over a 2-process mesh with axis `data`; and a barrier."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax
  from jax.sharding import NamedSharding, PartitionSpec

  from jaxdp.strategies import plain
  mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))

  def mapped(f):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=PartitionSpec(), out_specs=PartitionSpec(), check_vma=False))

  def compute(y):
    for _ in range(6):
      y = jnp.tanh(y @ y)
    return y

  put = lambda x: jax.device_put(x, NamedSharding(mesh, PartitionSpec()))  # noqa: E731
  tree = put([jnp.full(s, 0.01, jnp.float32) for s in SHAPES])
  flat, y = put(jnp.full((sum(int(np.prod(s)) for s in SHAPES),), 0.01, jnp.float32)), put(jnp.full((512, 512), 0.01))
  tiny = mapped(lambda x: lax.psum(x, "data")), put(jnp.zeros(()))
  barrier = lambda: jax.block_until_ready(tiny[0](tiny[1]))  # noqa: E731  Returns when both processes reach it.
  return {
      "jax psum, flat": (mapped(lambda x: lax.psum(x, "data")), (flat,)),
      "jaxdp flat mean": (mapped(lambda t: plain.flat_all_reduce_mean(t, "data")), (tree,)),
      "concatenate, 1-D": (mapped(lambda t: jnp.concatenate([x.ravel() for x in t])), (tree,)),
      "concatenate, one row": (mapped(lambda t: jnp.concatenate([x.reshape(1, -1) for x in t], axis=1)), (tree,)),
      "compute": (mapped(compute), (y,)),
      "psum + compute": (mapped(lambda x, y: (lax.psum(x, "data"), compute(y))), (flat, y)),
      "psum, compute: two programs": (lambda x, y, p=mapped(lambda x: lax.psum(x, "data")), c=mapped(compute):
                                      (p(x), c(y)), (flat, y)),
  }, barrier


def worker(rank: int, jax_port: int, torch_port: int, rounds: int, repeats: int) -> None:
  """One process: join both runtimes, time every contender `repeats` times per round, print rows (rank 0)."""
  import jax
  jax.config.update("jax_platforms", "cpu")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{jax_port}", num_processes=2, process_id=rank)
  import torch
  import torch.distributed as dist
  dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{torch_port}", rank=rank, world_size=2)
  torch.set_num_threads(1)
  buffer = torch.full((sum(int(torch.tensor(s).prod()) for s in SHAPES),), 0.01)
  contenders = {"torch all_reduce": lambda: dist.all_reduce(buffer)}
  programs, barrier = _programs()
  for name, (f, args) in programs.items():
    contenders[name] = lambda f=f, args=args: jax.block_until_ready(f(*args))
  times = {name: [] for name in contenders}
  for r in range(rounds + 1):  # Round 0 warms up (compiles, connects) and is not counted.
    for name, run in contenders.items():
      start = time.perf_counter()
      for _ in range(repeats):
        run()
      if r:
        times[name].append((time.perf_counter() - start) / repeats * 1e3)
      barrier()  # Both processes start the next contender together (some contenders never synchronize).
  if rank == 0:
    print("| contender | ms, median (min..max) |\n| --- | --- |")
    for name, t in times.items():
      print(f"| {name} | {abrun.fmt(t)} |")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=9)
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--out", default="")
  parser.add_argument("--xla_flags", default="--xla_cpu_multi_thread_eigen=false", help="XLA_FLAGS of both processes")
  parser.add_argument("--worker", type=int, nargs=3, help=argparse.SUPPRESS)  # rank jax_port torch_port
  args = parser.parse_args()
  if args.worker:
    return worker(*args.worker, args.rounds, args.repeats)
  from jaxdp.tools import launch
  env = {**os.environ, "XLA_FLAGS": args.xla_flags}
  ports = [str(launch.free_port()), str(launch.free_port())]
  cmd = [sys.executable, __file__, "--rounds", str(args.rounds), "--repeats", str(args.repeats), "--worker"]
  procs = [subprocess.Popen(cmd + [str(rank), *ports], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True) for rank in range(2)]
  table = "\n".join(line for line in procs[0].communicate()[0].splitlines() if line.startswith("|"))
  procs[1].wait()
  abrun.append(args.out, f"--rounds {args.rounds} --repeats {args.repeats} --xla_flags '{args.xla_flags}'", table)


if __name__ == "__main__":
  main()
