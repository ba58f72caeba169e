"""How far the host runs ahead of the devices in a 2-process run: steps dispatched but unfinished.

Each process runs jaxdp's real train step through the loop's `StepMetrics` bound (jaxdp.loop.step_metrics); a helper thread
records when each step's output is ready (it waits in order, so the loop itself never waits for it).
At each dispatch, the steps in flight are the earlier (and current) steps not yet finished.

  python experiments/in_flight.py [--steps 60]   # spawns the 2 processes itself
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time


def worker(steps: int) -> None:
  """One process: build the default CNN run, dispatch `steps` steps, print in-flight counts."""
  from jaxdp import build, data
  from jaxdp.loop import step_metrics
  from jaxdp.runtime import process
  from jaxdp.configs import default
  config = default.get_config()
  config.dataset.data_dir = os.environ["TFDS_DIR"]
  process.init(config)
  import jax
  parts = build.build(config)
  state = parts.init()
  batches = data.train_batches(parts.ds, "train", seed=0, global_batch=parts.layout.global_batch, start_step=0,
                               process_index=jax.process_index(), process_count=jax.process_count())
  host = [next(batches) for _ in range(steps)]
  state, m = parts.train_step(state, parts.backend.put_batch(host[0]))  # Compile outside the timing.
  jax.block_until_ready(m)
  tracker = step_metrics.StepMetrics(parts.backend, step_metrics.MAX_STEPS_IN_FLIGHT, 0)
  dispatched, done, outputs = [], [0.0] * steps, []
  ready = threading.Semaphore(0)

  def watch() -> None:
    for k in range(steps):
      ready.acquire()
      jax.block_until_ready(outputs[k])
      done[k] = time.perf_counter()

  thread = threading.Thread(target=watch)
  thread.start()
  for k in range(steps):
    state, m = parts.train_step(state, parts.backend.put_batch(host[k]))
    dispatched.append(time.perf_counter())
    outputs.append(m["nonfinite"])
    ready.release()
    tracker.push(k, m)
  thread.join()
  in_flight = [sum(1 for j in range(k + 1) if done[j] > dispatched[k]) for k in range(5, steps)]
  print(f"process {jax.process_index()}: steps in flight at dispatch: median {statistics.median(in_flight)}, "
        f"max {max(in_flight)}, share with >1: {sum(n > 1 for n in in_flight) / len(in_flight):.0%}; "
        f"bound MAX_STEPS_IN_FLIGHT={step_metrics.MAX_STEPS_IN_FLIGHT}", flush=True)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=60)
  parser.add_argument("--worker", action="store_true")
  args = parser.parse_args()
  if args.worker:
    return worker(args.steps)
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {**os.environ, "JAXDP_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAXDP_NUM_PROCESSES": "2",
         "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false", "TFDS_DIR": os.environ.get("TFDS_DIR", "/tmp/jaxdp-tfds")}
  procs = [subprocess.Popen([sys.executable, __file__, "--worker", "--steps", str(args.steps)],
                            env={**env, "JAXDP_PROCESS_ID": str(i)}) for i in range(2)]
  sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
  main()
