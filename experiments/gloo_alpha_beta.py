"""Measures gloo's all-reduce latency (alpha) and bandwidth (1 / beta) on localhost, for jaxdp.tools.projection's table.

    python experiments/gloo_alpha_beta.py [--sizes 1024,65536,262144,1048576] [--repeats 20]

Starts 2 processes (jax.distributed, 1 CPU device each, gloo collectives); each times a jitted psum of float32
vectors of the given lengths (median of `repeats` after warm-up). Fits t = a + b * bytes by least squares on
relative errors and, with the ring model at N = 2 (t = 2 alpha + bytes / bandwidth), prints alpha = a / 2 and bandwidth = 1 / b:
paste them into jaxdp/tools/projection.py's INTERCONNECTS["gloo-localhost"] and add the fit (date, load) to
experiments/projection_notes.md.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def worker(rank: int, port: int, sizes: list[int], repeats: int) -> None:
  """One process: join, time psums, print JSON {bytes: seconds} (rank 0)."""
  import jax
  import jax.numpy as jnp
  jax.config.update("jax_platforms", "cpu")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=rank)
  mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  spec = jax.sharding.PartitionSpec("data")
  f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "data"), mesh=mesh, in_specs=spec, out_specs=spec))
  out = {}
  for n in sizes:
    x = jax.make_array_from_process_local_data(jax.sharding.NamedSharding(mesh, spec), jnp.ones((n,), jnp.float32))
    for _ in range(3):
      jax.block_until_ready(f(x))
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(f(x))
      times.append(time.perf_counter() - start)
    out[4 * n] = statistics.median(times)
  if rank == 0:
    print(json.dumps(out))


def fit(times: dict[int, float]) -> tuple[float, float]:
  """(alpha seconds, bandwidth bytes/s) of t = 2 alpha + bytes / bandwidth, least squares."""
  import numpy as np
  x = np.array([float(b) for b in times])
  y = np.array(list(times.values()))
  slope, intercept = np.polyfit(x, y, 1, w=1 / y)  # Relative errors: small and large sizes count alike.
  return intercept / 2, 1 / slope


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--sizes", default="1024,65536,262144,1048576")  # float32 elements (4 KiB .. 4 MiB).
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--worker", type=int, default=-1)
  parser.add_argument("--port", type=int, default=0)
  args = parser.parse_args()
  sizes = [int(s) for s in args.sizes.split(",")]
  if args.worker >= 0:
    return worker(args.worker, args.port, sizes, args.repeats)
  from jaxdp.tools.launch import free_port
  port = free_port()
  cmd = [sys.executable, __file__, "--sizes", args.sizes, "--repeats", str(args.repeats), "--port", str(port)]
  procs = [subprocess.Popen(cmd + ["--worker", str(r)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "XLA_FLAGS": ""}) for r in range(2)]
  outs = [p.communicate(timeout=600)[0] for p in procs]
  line = next(l for l in outs[0].splitlines() if l.startswith("{"))
  times = {int(k): v for k, v in json.loads(line).items()}
  alpha, bandwidth = fit(times)
  for nbytes, t in times.items():
    print(f"{nbytes:>10} B  {t * 1e6:9.1f} us")
  print(f"alpha {alpha * 1e6:.1f} us, bandwidth {bandwidth / 1e9:.3f} GB/s, "
        f"load {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d', time.gmtime())}")


if __name__ == "__main__":
  main()
