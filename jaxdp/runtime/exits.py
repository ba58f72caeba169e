"""How a command ends: each exception reported once, with its exit status, and nothing left to hold the process."""

import atexit
import logging
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import NoReturn

log = logging.getLogger("jaxdp")

THREAD_GRACE_S = 5.0  # How long non-daemon threads may still run once a command has returned.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # jaxdp/, this file in jaxdp/runtime/.
# The last frame of a worker's Python traceback in TensorFlow's message: '  File "PATH", line N, in NAME'.
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)', re.M)
# What TensorFlow puts around a failed op's cause (its tags, a trailing `name:`, tf.data's prefix), and around a
# failed assertion's message (a source's `UnreadableExample` read through tf.data).
_TF_WRAPPING = re.compile(r"\{\{[^}]*\}\}|\[Op:\w+\]|\s*name: '?$|Error in user-defined function passed to \S+ "
                          r"transformation with iterator: \S+: ")
_TF_ASSERTION = re.compile(r"^assertion failed: \[(.*)\]$")


def release(error: BaseException) -> None:
  """Clears the locals of the finished frames that `error`, and every error chained to it, passed through."""
  # A tf.data iterator with calls in flight, kept by a traceback until interpreter shutdown, waits there forever.
  for e in _chained(error):
    traceback.clear_frames(e.__traceback__)  # Frames still running (the caller's) are skipped.


def _chained(error: BaseException) -> Iterator[BaseException]:
  """`error`, then each error it was raised from or while handling, and theirs, each once (a cause before a context)."""
  pending, seen = [error], set()
  while pending:
    e = pending.pop()
    if e is None or id(e) in seen:
      continue
    seen.add(id(e))
    yield e
    pending += [e.__context__, e.__cause__]


class InputFailure(Exception):
  """A failure reading input on the host (`data.ReadError`), reported as tf.data's are: one line naming its cause."""


def input_failure(error: BaseException) -> tuple[str, str] | None:
  """(one line, traceback kept only for jaxdp's own code, else "") for an input failure, or an error raised while
  handling one; None for anything else."""
  read = _in_chain(error, InputFailure)
  if read is not None:  # A read on the host: its cause is the source's own error, with its frames.
    return _raised_here(read.__cause__ or read, chain=True)
  tf = sys.modules.get("tensorflow")  # No OpError can exist before TensorFlow loads; importing it would take seconds.
  op_error = _in_chain(error, tf.errors.OpError) if tf is not None else None
  if op_error is None:
    return None
  if error is not op_error:  # Raised in this process's Python, while handling the worker's failure.
    return _raised_here(error, chain=False)
  message = op_error.message or ""
  head, sep, worker = message.partition("Traceback (most recent call last):")
  if not sep:  # A TensorFlow op failed on the data.
    return f"the input pipeline failed: {tf_cause(message) or type(op_error).__name__}", ""
  lines = [line for line in worker.strip().splitlines() if line.strip() and not line.lstrip().startswith("[[")]
  return _summary(lines[-1].strip() if lines else head.strip(), _FRAME.findall(worker),
                  "Traceback (most recent call last):" + worker.rstrip())


def tf_cause(message: str) -> str:
  """The first line of a TensorFlow error's message without what TensorFlow puts around the cause ("" if none)."""
  first = _TF_WRAPPING.sub("", (message.strip().splitlines() or [""])[0]).strip()
  return _TF_ASSERTION.sub(r"\1", first)  # Only the assertion's brackets: a cause may end in its own ("[3] vs. [4]").


def _raised_here(error: BaseException, chain: bool) -> tuple[str, str]:
  """`_summary` of an error raised in this process's Python, at its innermost frame."""
  where = [(f.filename, str(f.lineno), f.name) for f in traceback.extract_tb(error.__traceback__)[-1:]]
  return _summary(f"{type(error).__name__}: {error}", where, "".join(traceback.format_exception(error, chain=chain)))


def _summary(cause: str, frames: list[tuple[str, str, str]], text: str) -> tuple[str, str]:
  """The one line naming `cause` and its innermost frame; `text` kept only when that frame is jaxdp's."""
  if not frames:
    return f"an input worker failed: {cause}", ""
  path, line, name = frames[-1]
  ours = os.path.abspath(path).startswith(_PACKAGE_DIR + os.sep)
  return f"an input worker failed: {cause} (at {os.path.relpath(path)}:{line}, in {name})", text if ours else ""


def _in_chain(error: BaseException, kind: type) -> BaseException | None:
  """The first error of `kind` among `error` and the errors chained to it."""
  return next((e for e in _chained(error) if isinstance(e, kind)), None)


def report(error: Exception) -> None:
  """Prints an unexpected error: an input failure as one `error:` line, anything else with its traceback."""
  if (failure := input_failure(error)) is None:
    traceback.print_exception(error)
    return
  summary, kept_traceback = failure
  if kept_traceback:
    print(kept_traceback, file=sys.stderr)
  print(f"error: {summary}", file=sys.stderr)


def exit(status: int) -> NoReturn:  # noqa: A001  (the process's exit, as sys.exit)
  """Ends the process with `status` after its non-daemon threads (THREAD_GRACE_S at most) and atexit handlers."""
  # The interpreter's teardown is skipped: a native destructor there can wait forever.
  _join_threads(THREAD_GRACE_S)
  try:
    atexit._run_exitfuncs()  # What a normal exit runs after joining threads; os._exit would skip it.
  finally:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except (OSError, ValueError):  # A closed pipe: nothing more can reach it.
        pass
    os._exit(status)


def _join_threads(grace_s: float) -> None:
  """Waits up to `grace_s` for the non-daemon threads; names the ones still running, which exit then ends."""
  deadline = time.monotonic() + grace_s
  for t in _non_daemon():
    t.join(max(0.0, deadline - time.monotonic()))
  if stuck := [t.name for t in _non_daemon() if t.is_alive()]:
    log.warning("exiting with %d thread(s) still running: %s", len(stuck), ", ".join(stuck))


def _non_daemon() -> list[threading.Thread]:
  """The threads other than the main one that a normal exit would wait for."""
  return [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
