"""Issue 58's equivalence and resume figures as numbers: a weighted user task trained fully sharded against 1 device.

    python benchmarks/fsdp_equivalence.py [--workdir DIR]

Trains `tests/fsdp_train.py`'s task (a user's NNX model, per-example weights, Adam, 30 steps) on 8 simulated CPU
devices with shard_params, with 4 micro-batches, plainly, resumed across strategies and device counts (8 sharded ->
4 plain, 4 plain -> 8 sharded), and on 2 processes x 4 devices; prints each run's relative L2 distance from the
one-device run's final parameters. `tests/test_fsdp.py` asserts the bounds; this prints the values.
"""

import sys

from jaxdp.runtime import cpu_devices

if __name__ == "__main__":  # Before JAX is imported: XLA reads XLA_FLAGS once.
  cpu_devices.simulate(8)

import argparse  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
sys.path.insert(0, TESTS)
import fsdp_train  # noqa: E402
import runs  # noqa: E402


def rel(a: dict, b: dict) -> float:
  """‖a − b‖ / ‖b‖ over every leaf of two flat parameter dicts."""
  a, b = (np.concatenate([np.ravel(t[k]) for k in sorted(t)]).astype(np.float64) for t in (a, b))
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def two_processes(workdir: str) -> dict:
  """The task's final parameters trained sharded by `jaxdp.launch` on 2 processes x 4 devices."""
  env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},
         "PYTHONPATH": os.pathsep.join([os.getcwd(), TESTS])}
  subprocess.run([sys.executable, "-m", "jaxdp.launch", "--num_processes", "2", "--devices_per_process", "4", "--",
                  os.path.join(TESTS, "fsdp_train.py"), workdir, "--shard_params"], env=env, check=True, timeout=900)
  return runs.final(workdir)


def main() -> None:
  """Prints each run's distance from one device."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default=None, help="where the runs write (default: a new temporary folder)")
  root = parser.parse_args().workdir or tempfile.mkdtemp(prefix="fsdp_equivalence")
  w = lambda name: os.path.join(root, name)  # noqa: E731
  one = fsdp_train.train(w("one"), num_devices=1)
  sharded = fsdp_train.train(w("sharded"), shard_params=True)
  print("8 sharded vs 1 device:", rel(sharded, one))
  print("8 sharded, 4 micro-batches vs 1 device:",
        rel(fsdp_train.train(w("accum"), shard_params=True, grad_accum_steps=4), one))
  print("8 sharded vs 8 plain:", rel(sharded, fsdp_train.train(w("plain"))))
  fsdp_train.train(w("a"), steps=15, checkpoint_every=15, shard_params=True)
  print("8 sharded -> 4 plain vs 1 device:", rel(fsdp_train.train(w("a"), num_devices=4), one))
  fsdp_train.train(w("b"), steps=15, checkpoint_every=15, num_devices=4)
  print("4 plain -> 8 sharded vs 1 device:", rel(fsdp_train.train(w("b"), shard_params=True), one))
  print("2 processes x 4 sharded vs 1 device:", rel(two_processes(w("two")), one))


if __name__ == "__main__":
  main()
