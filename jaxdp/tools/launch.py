"""`python -m jaxdp.launch --num_processes P --devices_per_process D -- <jaxdp.train arguments | SCRIPT.py ARGS>`.

Starts P local processes of `jaxdp.train` (or of the user's script, when the first argument after `--` ends
in `.py`, as torchrun does: its `train_and_evaluate` joins the run) that join one run through
`jax.distributed` (coordinator on 127.0.0.1, a free port), each with D CPU devices; prefixes each line of their output with its rank
(leaving out gloo's connection lines); exits with the first non-zero status (stopping the others), or 0
when all succeed. The processes die with the launcher, however it ends.

With `--max_restarts N`, a process that dies (a signal, a crash; not a config mistake, status 2) makes the
launcher stop the others and start the whole group again, up to N times; the processes resume from the
newest checkpoint in WORKDIR/checkpoints/. With `--min_processes M` below P, a rank that cannot be
restarted (it failed, and then failed again before joining the run) is left out: the group goes on with
one process fewer (each with D devices), down to M.
"""

import argparse
import dataclasses
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

from jaxdp.runtime import cpu_devices, distributed
from jaxdp.loop import goodput
from jaxdp.tools import launch_state

GRACE_S = 10.0  # How long processes stopped by an interrupt get to checkpoint and exit before they are killed.
# How long the others get after a process failed: they cannot finish (their collectives and the preemption
# service wait for the lost one, and the service takes SIGTERM), so waiting longer only delays the exit.
LOST_GRACE_S = 0.5
CONFIG_ERROR = 2  # jaxdp's exit status for a config or command-line mistake: restarting cannot help.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")  # Set to a pinned process's cores.
# gloo (XLA's CPU collectives) writes "[Gloo] Rank 0 is connected to 3 peer ranks. Expected number of
# connected peer ranks is : 3" to stdout for every communicator it sets up, with no setting to turn it off,
# piece by piece, from one thread per local device: the pieces of two threads interleave in any order
# (docs/design-notes.md#launch). So a launched process prints Python's lines to its stderr
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


@dataclasses.dataclass
class Failure:
  """The first process of a group to fail: its rank, exit status (negative: killed by that signal), and
  whether it had joined the run (created its distributed.ENV_JOINED_FILE)."""
  rank: int
  status: int
  joined: bool


def _env(rank: int, args: argparse.Namespace, port: int, share: list[int] | None, num_processes: int = 0,
         joined_file: str = "", restarted: bool = False) -> dict[str, str]:
  env = dict(os.environ)
  if "XLA_FLAGS" in env:  # The user's flags reach every process; the device count is --devices_per_process.
    env["XLA_FLAGS"] = " ".join(f for f in env["XLA_FLAGS"].split() if not f.startswith(cpu_devices.DEVICE_COUNT_FLAG))
  env.update({distributed.ENV_COORDINATOR: f"127.0.0.1:{port}",
              distributed.ENV_NUM_PROCESSES: str(num_processes or args.num_processes),
              distributed.ENV_PROCESS_ID: str(rank), "JAXDP_CPU_DEVICES": str(args.devices_per_process),
              "PYTHONUNBUFFERED": "1", distributed.ENV_PRINT_TO_STDERR: "1",
              distributed.ENV_LAUNCHER_PID: str(os.getpid())})
  env.pop(goodput.ENV_RESTARTED, None)
  if joined_file:
    env[distributed.ENV_JOINED_FILE] = joined_file
  if restarted:
    env[goodput.ENV_RESTARTED] = "1"
  for name in THREAD_VARS if share else ():  # XLA and tf.data size their pools from the affinity; BLAS needs these.
    env.setdefault(name, str(len(share)))
  return env


def _shares(args: argparse.Namespace, num_processes: int = 0) -> list[list[int] | None]:
  """Each process's cores when pinning (Linux), else None for each."""
  num_processes = num_processes or args.num_processes
  if not (args.pin_cpus and hasattr(os, "sched_setaffinity")):
    return [None] * num_processes
  cores = sorted(os.sched_getaffinity(0))
  return [cpu_share(r, num_processes, cores) for r in range(num_processes)]


def _relay(rank: int, stream: typing.TextIO, native: bool = False) -> None:
  """Copies a process's output to ours, each line prefixed with its rank; from `native` stdout, without gloo's."""
  for line in stream:
    if native:
      line = GLOO_PIECES.sub("", line)
      if not line.strip(string.whitespace + string.digits):
        continue
    sys.stdout.write(f"[{rank}] {line}")
    sys.stdout.flush()


def describe(status: int) -> str:
  """`was lost (killed by SIGKILL)` or `exited with status 1`."""
  if status < 0:
    return f"was lost (killed by {signal.Signals(-status).name})"
  return f"exited with status {status}"


class _Interrupted(Exception):
  """The launcher was asked to stop (Ctrl-C or SIGTERM)."""


def _interrupt(signum: int, frame: object) -> None:
  del signum, frame
  raise _Interrupted


class Group:
  """One start of the P processes, their output relayed; `wait()` for the outcome."""

  def __init__(self, args: argparse.Namespace, size: int, state_dir: str, attempt: int):
    cmd = command(args.train_args)
    port = args.port or free_port()
    self.joined_files = [os.path.join(state_dir, f"joined-{attempt}-{r}") for r in range(size)]
    self.procs = []
    for r, share in enumerate(_shares(args, size)):
      env = _env(r, args, port, share, size, self.joined_files[r], restarted=attempt > 0)
      self.procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         start_new_session=True))
      if share:  # From here, not preexec_fn (unsafe once our relay threads run): before the child starts JAX.
        os.sched_setaffinity(self.procs[-1].pid, share)
    self.relays = [threading.Thread(target=_relay, args=(r, p.stderr), daemon=True) for r, p in enumerate(self.procs)]
    self.relays += [threading.Thread(target=_relay, args=(r, p.stdout, True), daemon=True)
                    for r, p in enumerate(self.procs)]
    for t in self.relays:
      t.start()

  def wait(self) -> Failure | None:
    """Waits for all; on the first failure, stops the rest and returns it; None when all succeeded."""
    failure = self._wait()  # An interrupt leaves the relays running: interrupt() stops the processes first.
    for t in self.relays:
      t.join(timeout=5)
    return failure

  def _wait(self) -> Failure | None:
    while True:
      failed = [rank for rank, p in enumerate(self.procs) if p.poll() not in (None, 0)]
      if failed:  # Of two found at once, the one killed by a signal is likelier the first: the other noticed.
        rank = min(failed, key=lambda r: self.procs[r].returncode > 0)
        stop([q for q in self.procs if q is not self.procs[rank]], signal.SIGTERM, LOST_GRACE_S)
        return Failure(rank, self.procs[rank].returncode, os.path.exists(self.joined_files[rank]))
      if all(p.poll() == 0 for p in self.procs):
        return None
      time.sleep(0.05)

  def interrupt(self) -> int:
    """Stops every process the way Ctrl-C does (each checkpoints and exits); the launcher's status."""
    stop(self.procs, signal.SIGINT, GRACE_S)  # Each process checkpoints and exits (preemption path).
    for t in self.relays:
      t.join(timeout=5)
    return max((abs(p.returncode) for p in self.procs), default=0) and 1


def stop(procs: list[subprocess.Popen], sig: int, grace_s: float) -> None:
  """Sends `sig`, then kills whatever has not exited after `grace_s` seconds."""
  for p in procs:
    if p.poll() is None:
      os.killpg(p.pid, sig)
  deadline = time.time() + grace_s
  for p in procs:
    try:
      p.wait(timeout=max(0.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
      os.killpg(p.pid, signal.SIGKILL)
      p.wait()


def command(train_args: list[str]) -> list[str]:
  """Each process's command line: the user's script when the first argument ends in `.py`, else jaxdp.train."""
  if train_args[:1] and train_args[0].endswith(".py"):
    return [sys.executable, *train_args]
  return [sys.executable, "-m", "jaxdp.train", *train_args]


def workdir_of(train_args: list[str]) -> str | None:
  """The `--workdir` among jaxdp.train's arguments (`--workdir DIR` or `--workdir=DIR`), else None."""
  for i, arg in enumerate(train_args):
    if arg in ("--workdir", "-workdir") and i + 1 < len(train_args):
      return train_args[i + 1]
    if arg.startswith(("--workdir=", "-workdir=")):
      return arg.split("=", 1)[1]
  return None


def newest_step(workdir: str | None) -> int | None:
  """The newest complete checkpoint's step in WORKDIR/checkpoints/, or None."""
  from jaxdp import checkpoint  # Imports orbax: here, so only a restart pays for it.
  steps = checkpoint.steps(workdir or "")
  return steps[-1] if steps else None


@dataclasses.dataclass
class _Plan:
  """What the launcher does after a failure: the next group's size, or an exit status."""
  size: int = 0
  status: int | None = None


class Launcher:
  """Starts groups until one succeeds, restarting after failures within --max_restarts / --min_processes."""

  def __init__(self, args: argparse.Namespace):
    self.args = args
    self.size = args.num_processes
    self.restarts = 0
    self.failed_rank: int | None = None  # The rank that failed the previous group, if any.

  def run(self, state_dir: str) -> int:
    previous = signal.signal(signal.SIGTERM, _interrupt)  # Ours: stop the processes the way Ctrl-C does.
    try:
      while True:
        group = Group(self.args, self.size, state_dir, self.restarts)
        try:
          failure = group.wait()
        except (KeyboardInterrupt, _Interrupted):
          return group.interrupt()
        if failure is None:
          return 0
        plan = self.after(failure)
        if plan.status is not None:
          return plan.status
    finally:
      signal.signal(signal.SIGTERM, previous)

  def after(self, failure: Failure) -> _Plan:
    """Prints what happened and decides: restart (at which size), or exit (with which status)."""
    who = f"process {failure.rank} of {self.size} {describe(failure.status)}"
    exit_status = failure.status if failure.status > 0 else 128 - failure.status
    gone = not failure.joined and failure.rank == self.failed_rank
    self.failed_rank = failure.rank
    if failure.status == CONFIG_ERROR:
      return _Plan(status=_error(f"{who} (a config or command-line mistake: not restarted); stopped the others",
                                 exit_status))
    if self.restarts >= self.args.max_restarts:
      spent = f" after {self.restarts} restart{'s' * (self.restarts != 1)}" if self.args.max_restarts else ""
      return _Plan(status=_error(f"{who}{spent}; stopped the others", exit_status))
    size = self.size
    if gone:
      if size - 1 < self.args.min_processes:
        return _Plan(status=_error(f"{who} again before joining the run: it cannot be restarted, and "
                                   f"--min_processes={self.args.min_processes} allows no fewer than {size}",
                                   exit_status))
      size, self.failed_rank = size - 1, None  # The ranks are numbered anew.
      who += f" again before joining the run: it cannot be restarted; going on with {size} of {self.size}"
    self.restarts += 1
    step = newest_step(workdir_of(self.args.train_args))
    where = f"from step {step}" if step is not None else "from the start (no checkpoint yet)"
    print(f"launch: {who}; restart {self.restarts} of {self.args.max_restarts} {where}", file=sys.stderr,
          flush=True)
    self.size = size
    return _Plan(size=size)


def _error(message: str, status: int) -> int:
  print(f"error: {message}", file=sys.stderr, flush=True)
  return status


def launch(args: argparse.Namespace) -> int:
  """Runs the processes, restarting them as allowed; returns the launcher's exit status."""
  with launch_state.state_dir() as state_dir:
    return Launcher(args).run(state_dir)


def parse(argv: list[str]) -> argparse.Namespace:
  """Launcher flags; everything after `--` goes to jaxdp.train."""
  parser = argparse.ArgumentParser(prog="python -m jaxdp.launch", description=__doc__.splitlines()[0])
  parser.add_argument("--num_processes", type=int, required=True, help="Local processes to start.")
  parser.add_argument("--devices_per_process", type=int, default=1, help="CPU devices each process simulates.")
  parser.add_argument("--port", type=int, default=0, help="Coordinator port on 127.0.0.1 (0: a free one).")
  # Off by default: no gain seen on the machines tried. Why: docs/design-notes.md#launch
  parser.add_argument("--pin_cpus", action=argparse.BooleanOptionalAction, default=False,
                      help="Pin each process to its own 1/P of the cores, with as many BLAS/OpenMP threads (Linux).")
  parser.add_argument("--max_restarts", type=int, default=0,
                      help="Start the whole group again after a process dies (not after status 2), this many times; "
                           "the processes resume from the newest checkpoint.")
  parser.add_argument("--min_processes", type=int, default=0,
                      help="Elastic: go on with fewer processes, down to this many, when a rank cannot be restarted "
                           "(it fails again before joining the run). Default: --num_processes (never fewer).")
  parser.add_argument("train_args", nargs=argparse.REMAINDER,
                      help="-- then jaxdp.train's arguments, or a script (SCRIPT.py) and its arguments.")
  args = parser.parse_args(argv)
  args.train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
  for name in ("num_processes", "devices_per_process"):
    if getattr(args, name) < 1:
      parser.exit(2, f"error: --{name} must be a positive integer, got {getattr(args, name)}\n")
  if args.max_restarts < 0:
    parser.exit(2, f"error: --max_restarts must be 0 or more, got {args.max_restarts}\n")
  args.min_processes = args.min_processes or args.num_processes
  if not 1 <= args.min_processes <= args.num_processes:
    parser.exit(2, f"error: --min_processes must be between 1 and --num_processes ({args.num_processes}), "
                   f"got {args.min_processes}\n")
  return args


def main(argv: list[str]) -> int:
  return launch(parse(argv))


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
