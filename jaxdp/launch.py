"""`python -m jaxdp.launch --num_processes P --devices_per_process D -- <jaxdp.train arguments>`.

Starts P local processes of `jaxdp.train` that join one run through `jax.distributed` (coordinator on
127.0.0.1, a free port), each with D CPU devices; prefixes each line of their output with its rank
(leaving out gloo's connection lines); exits with the first non-zero status (stopping the others), or 0
when all succeed.
"""

import argparse
import functools
import os
import re
import signal
import socket
import string
import subprocess
import sys
import threading
import time
import typing

from jaxdp import distributed

GRACE_S = 10.0  # How long stopped processes get to exit before they are killed.
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")  # Set to a pinned process's cores.
# gloo (XLA's CPU collectives) writes "[Gloo] Rank 0 is connected to 3 peer ranks. Expected number of
# connected peer ranks is : 3" to stdout for every communicator it sets up, with no setting to turn it off,
# piece by piece, from one thread per local device: the pieces of two threads interleave in any order (CI saw
# "[Gloo] Rank 1 peer ranks. 0 is connected to"). So a launched process prints Python's lines to its stderr
# (distributed.ENV_PRINT_TO_STDERR), where gloo cannot cut into them, and its native stdout is relayed without
# gloo's pieces and the numbers left between them.
GLOO_PIECES = re.compile(r"\[Gloo\] Rank |is connected to |peer ranks\. |Expected number of connected peer ranks is : ")


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on right now."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def cpu_share(rank: int, num_processes: int, cores: list[int]) -> list[int]:
  """The cores process `rank` runs on: its contiguous 1/P of `cores` (one core, shared, when P > cores)."""
  if num_processes >= len(cores):
    return [cores[rank % len(cores)]]
  return cores[rank * len(cores) // num_processes:(rank + 1) * len(cores) // num_processes]


def _env(rank: int, args: argparse.Namespace, port: int, share: list[int] | None) -> dict[str, str]:
  env = dict(os.environ)
  if "XLA_FLAGS" in env:  # The user's flags reach every process; the device count is --devices_per_process.
    env["XLA_FLAGS"] = " ".join(f for f in env["XLA_FLAGS"].split() if not f.startswith(DEVICE_COUNT_FLAG))
  env.update({distributed.ENV_COORDINATOR: f"127.0.0.1:{port}", distributed.ENV_NUM_PROCESSES: str(args.num_processes),
              distributed.ENV_PROCESS_ID: str(rank), "JAXDP_CPU_DEVICES": str(args.devices_per_process),
              "PYTHONUNBUFFERED": "1", distributed.ENV_PRINT_TO_STDERR: "1"})
  for name in THREAD_VARS if share else ():  # XLA and tf.data size their pools from the affinity; BLAS needs these.
    env.setdefault(name, str(len(share)))
  return env


def _shares(args: argparse.Namespace) -> list[list[int] | None]:
  """Each process's cores when pinning (Linux), else None for each."""
  if not (args.pin_cpus and hasattr(os, "sched_setaffinity")):
    return [None] * args.num_processes
  cores = sorted(os.sched_getaffinity(0))
  return [cpu_share(r, args.num_processes, cores) for r in range(args.num_processes)]


def _relay(rank: int, stream: typing.TextIO, native: bool = False) -> None:
  """Copies a process's output to ours, each line prefixed with its rank; from `native` stdout, without gloo's."""
  for line in stream:
    if native:
      line = GLOO_PIECES.sub("", line)
      if not line.strip(string.whitespace + string.digits):
        continue
    sys.stdout.write(f"[{rank}] {line}")
    sys.stdout.flush()


def _describe(status: int) -> str:
  if status < 0:
    return f"was lost (killed by {signal.Signals(-status).name})"
  return f"exited with status {status}"


def launch(args: argparse.Namespace) -> int:
  """Runs the processes; returns the launcher's exit status."""
  port = args.port or free_port()
  cmd = [sys.executable, "-m", "jaxdp.train", *args.train_args]
  procs = [subprocess.Popen(cmd, env=_env(r, args, port, share), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=functools.partial(os.sched_setaffinity, 0, share) if share else None)
           for r, share in enumerate(_shares(args))]  # No thread of ours runs yet: preexec_fn is safe here.
  relays = [threading.Thread(target=_relay, args=(r, p.stderr), daemon=True) for r, p in enumerate(procs)]
  relays += [threading.Thread(target=_relay, args=(r, p.stdout, True), daemon=True) for r, p in enumerate(procs)]
  for t in relays:
    t.start()
  try:
    failed = _wait(procs)
  except KeyboardInterrupt:
    failed = None
    _stop(procs, signal.SIGINT)  # Each process checkpoints and exits (preemption path).
  for t in relays:
    t.join(timeout=5)
  if failed is None:
    return max((abs(p.returncode) for p in procs), default=0) and 1
  rank, status = failed
  print(f"error: process {rank} of {len(procs)} {_describe(status)}; stopped the others", file=sys.stderr)
  return status if status > 0 else 128 - status


def _wait(procs: list[subprocess.Popen]) -> tuple[int, int] | None:
  """Waits for all; on the first failure, stops the rest and returns (rank, status)."""
  while True:
    for rank, p in enumerate(procs):
      if p.poll() not in (None, 0):
        _stop([q for q in procs if q is not p], signal.SIGTERM)
        return rank, p.returncode
    if all(p.poll() == 0 for p in procs):
      return None
    time.sleep(0.05)


def _stop(procs: list[subprocess.Popen], sig: int) -> None:
  """Sends `sig`, then kills whatever has not exited after the grace period."""
  for p in procs:
    if p.poll() is None:
      os.killpg(p.pid, sig)
  deadline = time.time() + GRACE_S
  for p in procs:
    try:
      p.wait(timeout=max(0.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
      os.killpg(p.pid, signal.SIGKILL)
      p.wait()


def parse(argv: list[str]) -> argparse.Namespace:
  """Launcher flags; everything after `--` goes to jaxdp.train."""
  parser = argparse.ArgumentParser(prog="python -m jaxdp.launch", description=__doc__.splitlines()[0])
  parser.add_argument("--num_processes", type=int, required=True, help="Local processes to start.")
  parser.add_argument("--devices_per_process", type=int, default=1, help="CPU devices each process simulates.")
  parser.add_argument("--port", type=int, default=0, help="Coordinator port on 127.0.0.1 (0: a free one).")
  # Off by default: on a shared 2-core machine, pinning 2 processes made steps 2.2-2.7x slower (README).
  parser.add_argument("--pin_cpus", action=argparse.BooleanOptionalAction, default=False,
                      help="Pin each process to its own 1/P of the cores, with as many BLAS/OpenMP threads (Linux).")
  parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then jaxdp.train's arguments.")
  args = parser.parse_args(argv)
  args.train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
  for name in ("num_processes", "devices_per_process"):
    if getattr(args, name) < 1:
      parser.exit(2, f"error: --{name} must be a positive integer, got {getattr(args, name)}\n")
  return args


def main(argv: list[str]) -> int:
  return launch(parse(argv))


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
