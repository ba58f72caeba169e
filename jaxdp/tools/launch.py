"""`python -m jaxdp.launch --num_processes P --devices_per_process D -- <jaxdp.train arguments | SCRIPT.py ARGS>`."""

import argparse
import contextlib
import dataclasses
import fcntl
import glob
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
import typing
from collections.abc import Iterator

from jaxdp.loop import goodput
from jaxdp.runtime import cpu_devices, distributed
from jaxdp.tools import cli

GRACE_S = 10.0  # How long processes stopped by an interrupt get to checkpoint and exit before they are killed.
# After a process failed the others cannot finish (their collectives wait for the lost one): waiting only delays.
LOST_GRACE_S = 0.5
CONFIG_ERROR = 2  # jaxdp's exit status for a config or command-line mistake: restarting cannot help.
# gloo's connection lines, written piece by piece to native stdout from several threads: dropped wherever they fall
# (a launched process prints Python's lines to stderr instead). docs/design-notes.md#launch
GLOO_PIECES = re.compile(r"\[Gloo\] Rank |is connected to |peer ranks\. |Expected number of connected peer ranks is : ")

PREFIX = "jaxdp-launch-"
# Locked by the launcher that made the dir while it lives: the kernel drops the lock however it dies, so a later
# launcher removes the dirs of killed ones.
OWNER = "owner"


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on right now."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@dataclasses.dataclass
class Failure:
  """The first process of a group to fail: rank, status (negative: its signal), whether it had joined the run."""
  rank: int
  status: int
  joined: bool


def _env(rank: int, args: argparse.Namespace, port: int, size: int = 0, joined_file: str = "",
         restarted: bool = False) -> dict[str, str]:
  """Process `rank`'s environment: how it joins the run and its devices."""
  env = dict(os.environ)
  if "XLA_FLAGS" in env:  # The user's flags reach every process; the device count is --devices_per_process.
    env["XLA_FLAGS"] = " ".join(f for f in env["XLA_FLAGS"].split() if not f.startswith(cpu_devices.DEVICE_COUNT_FLAG))
  env.pop(goodput.ENV_RESTARTED, None)
  env.update({distributed.ENV_COORDINATOR: f"127.0.0.1:{port}", distributed.ENV_PROCESS_ID: str(rank),
              distributed.ENV_NUM_PROCESSES: str(size or args.num_processes), "PYTHONUNBUFFERED": "1",
              cpu_devices.ENV_VAR: str(args.devices_per_process), distributed.ENV_PRINT_TO_STDERR: "1",
              distributed.ENV_LAUNCHER_PID: str(os.getpid())})
  if joined_file:
    env[distributed.ENV_JOINED_FILE] = joined_file
  if restarted:
    env[goodput.ENV_RESTARTED] = "1"
  return env


def _relay(rank: int, stream: typing.TextIO, native: bool = False) -> None:
  """Copies a process's output to ours, each line prefixed with its rank; from `native` stdout, without gloo's."""
  for line in stream:
    if native and not (line := GLOO_PIECES.sub("", line)).strip(string.whitespace + string.digits):
      continue
    sys.stdout.write(f"[{rank}] {line}")
    sys.stdout.flush()


class Group:
  """One start of the processes, their output relayed; `wait()` for the outcome."""

  def __init__(self, args: argparse.Namespace, size: int, state_dir: str, attempt: int):
    script = args.train_args[:1] and args.train_args[0].endswith(".py")  # A user's script, as torchrun runs it.
    cmd = [sys.executable, *([] if script else ["-m", "jaxdp.train"]), *args.train_args]
    port = args.port or free_port()
    self.joined_files = [os.path.join(state_dir, f"joined-{attempt}-{r}") for r in range(size)]
    self.procs = []
    for r in range(size):
      env = _env(r, args, port, size, self.joined_files[r], restarted=attempt > 0)
      self.procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         start_new_session=True))
    self.relays = [threading.Thread(target=_relay, args=(r, stream, stream is p.stdout), daemon=True)
                   for r, p in enumerate(self.procs) for stream in (p.stderr, p.stdout)]
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
      if failed := [rank for rank, p in enumerate(self.procs) if p.poll() not in (None, 0)]:
        # Of two found at once, the one killed by a signal is likelier the first: the other noticed.
        rank = min(failed, key=lambda r: self.procs[r].returncode > 0)
        stop([q for q in self.procs if q is not self.procs[rank]], signal.SIGTERM, LOST_GRACE_S)
        return Failure(rank, self.procs[rank].returncode, os.path.exists(self.joined_files[rank]))
      if all(p.poll() == 0 for p in self.procs):
        return None
      time.sleep(0.05)

  def interrupt(self) -> int:
    """Stops every process the way Ctrl-C does (each checkpoints and exits); the launcher's status."""
    stop(self.procs, signal.SIGINT, GRACE_S)
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


class Launcher:
  """Starts groups until one succeeds, restarting after failures within --max_restarts / --min_processes."""

  def __init__(self, args: argparse.Namespace):
    self.args, self.size, self.restarts = args, args.num_processes, 0
    self.failed_rank: int | None = None  # The rank that failed the previous group, if any.

  def run(self, state_dir: str) -> int:
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # Stop the processes as Ctrl-C does.
    try:
      while True:
        group = Group(self.args, self.size, state_dir, self.restarts)
        try:
          failure = group.wait()
        except KeyboardInterrupt:
          return group.interrupt()
        if failure is None:
          return 0
        if (status := self.after(failure)) is not None:
          return status
    finally:
      signal.signal(signal.SIGTERM, previous)

  def after(self, failure: Failure) -> int | None:
    """Prints what happened and decides: restart (None; `self.size` processes next), or exit with the status."""
    how = (f"was lost (killed by {signal.Signals(-failure.status).name})" if failure.status < 0
           else f"exited with status {failure.status}")
    who, min_processes = f"process {failure.rank} of {self.size} {how}", self.args.min_processes
    status = failure.status if failure.status > 0 else 128 - failure.status
    gone = not failure.joined and failure.rank == self.failed_rank
    self.failed_rank = failure.rank
    if failure.status == CONFIG_ERROR:
      return _error(f"{who} (a config or command-line mistake: not restarted); stopped the others", status)
    if self.restarts >= self.args.max_restarts:
      spent = f" after {self.restarts} restart{'s' * (self.restarts != 1)}" if self.args.max_restarts else ""
      return _error(f"{who}{spent}; stopped the others", status)
    if gone:
      if self.size - 1 < min_processes:
        return _error(f"{who} again before joining the run: it cannot be restarted, and "
                      f"--min_processes={min_processes} allows no fewer than {self.size}", status)
      who += (f" again before joining the run: it cannot be restarted; going on with {self.size - 1} of "
              f"{self.size}")
      self.size, self.failed_rank = self.size - 1, None  # The ranks are numbered anew.
    self.restarts += 1
    from jaxdp import checkpoint  # Imports orbax: here, so only a restart pays for it.
    steps = checkpoint.steps(cli.flag_value(self.args.train_args, "workdir") or "")
    where = f"from step {steps[-1]}" if steps else "from the start (no checkpoint yet)"
    print(f"launch: {who}; restart {self.restarts} of {self.args.max_restarts} {where}", file=sys.stderr, flush=True)
    return None


def _error(message: str, status: int) -> int:
  print(f"error: {message}", file=sys.stderr, flush=True)
  return status


@contextlib.contextmanager
def state_dir() -> Iterator[str]:
  """A new state dir, owned while the context lasts; the dead launchers' dirs are removed first."""
  sweep(tempfile.gettempdir())
  with tempfile.TemporaryDirectory(prefix=PREFIX) as path:
    with open(os.path.join(path, f".{OWNER}"), "w") as owner:
      fcntl.flock(owner, fcntl.LOCK_EX)
      os.rename(owner.name, os.path.join(path, OWNER))  # Named only once locked: a sweep never finds it free.
      yield path


def sweep(root: str) -> list[str]:
  """Removes the state dirs under `root` whose launcher died; returns them."""
  removed = []
  for path in glob.glob(os.path.join(glob.escape(root), PREFIX + "*")):
    try:
      owner = open(os.path.join(path, OWNER))
    except OSError:  # Not one of ours, being made, just removed, or made before dirs had owners.
      continue
    with owner:
      try:
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError:  # Its launcher lives.
        continue
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)
  return removed


def parse(argv: list[str]) -> argparse.Namespace:
  """Launcher flags; everything after `--` goes to jaxdp.train (or the script)."""
  parser = argparse.ArgumentParser(prog="python -m jaxdp.launch", description=__doc__.splitlines()[0])
  add = parser.add_argument
  add("--num_processes", type=int, required=True, help="Local processes to start.")
  add("--devices_per_process", type=int, default=1, help="CPU devices each process simulates.")
  add("--port", type=int, default=0, help="Coordinator port on 127.0.0.1 (0: a free one).")
  add("--max_restarts", type=int, default=0, help="Start the whole group again after a process dies (not after "
      "status 2), this many times; the processes resume from the newest checkpoint.")
  add("--min_processes", type=int, default=0, help="Elastic: go on with fewer processes, down to this many, when a "
      "rank cannot be restarted (it fails again before joining the run). Default: --num_processes (never fewer).")
  add("train_args", nargs=argparse.REMAINDER, help="-- then jaxdp.train's arguments, or SCRIPT.py and its arguments.")
  args = parser.parse_args(argv)
  args.train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
  args.min_processes = args.min_processes or args.num_processes
  for name, low, high, what in (("num_processes", 1, None, "a positive integer"),
                                ("devices_per_process", 1, None, "a positive integer"),
                                ("max_restarts", 0, None, "0 or more"),
                                ("min_processes", 1, args.num_processes,
                                 f"between 1 and --num_processes ({args.num_processes})")):
    if not low <= getattr(args, name) <= (high or getattr(args, name)):
      parser.exit(2, f"error: --{name} must be {what}, got {getattr(args, name)}\n")
  return args


def main(argv: list[str]) -> int:
  """Runs the processes, restarting them as allowed; returns the launcher's exit status."""
  args = parse(argv)
  with state_dir() as path:
    return Launcher(args).run(path)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
