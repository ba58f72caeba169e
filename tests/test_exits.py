"""How a command ends (`jaxdp.runtime.exits`): an input failure is one line, jaxdp's own keeps its traceback, what
an error's frames hold is released, and `exit` still runs the process's cleanup."""

import gc
import os
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest
import tensorflow as tf

from jaxdp.runtime import exits

TESTS = os.path.dirname(os.path.abspath(__file__))


def _read(step: np.int64) -> np.int64:
  raise ValueError(f"bad step {step}")


def _worker_failure() -> tf.errors.OpError:
  """What the loop gets when a dataset's Python read raises inside a tf.data worker."""
  try:
    for _ in tf.data.Dataset.range(3).map(lambda s: tf.numpy_function(_read, [s], tf.int64)):
      pass
  except tf.errors.OpError as e:
    return e
  raise AssertionError("the read did not fail")


def _op_failure(batched: bool) -> tf.errors.OpError:
  """What the loop gets when a TensorFlow op fails on the data (no Python code of anyone's); unbatched, tf.data
  puts the map's name and iterator before the cause."""
  decoded = tf.data.Dataset.from_tensor_slices([b"no image"]).map(tf.io.decode_png)
  try:
    for _ in decoded.batch(1) if batched else decoded:
      pass
  except tf.errors.OpError as e:
    return e
  raise AssertionError("the decode did not fail")


def test_a_failure_in_the_users_code_is_one_line_naming_the_cause_and_where():
  summary, kept = exits.input_failure(_worker_failure())
  assert summary.startswith("an input worker failed: ValueError: bad step 0 (at "), summary
  assert summary.endswith(f"{os.path.basename(__file__)}:{_read.__code__.co_firstlineno + 1}, in _read)"), summary
  assert kept == ""


def test_a_failure_in_jaxdps_own_code_keeps_its_traceback(monkeypatch, capsys):
  """A failing frame of jaxdp's is a bug to report: the worker's traceback is printed above the `error:` line."""
  monkeypatch.setattr(exits, "_PACKAGE_DIR", TESTS)  # This file's frames count as jaxdp's.
  error = _worker_failure()
  summary, kept = exits.input_failure(error)
  assert kept.startswith("Traceback (most recent call last):") and 'raise ValueError(f"bad step {step}")' in kept
  exits.report(error)
  err = capsys.readouterr().err
  assert err.index("Traceback") < err.index(f"error: {summary}") and err.count("error: ") == 1, err


@pytest.mark.parametrize("batched", [True, False])
def test_an_op_failing_on_the_data_is_one_line_without_tensorflows_tags(capsys, batched):
  exits.report(_op_failure(batched))
  err = capsys.readouterr().err
  assert err.startswith("error: the input pipeline failed: Unknown image file format.") and err.count("\n") == 1, err
  assert not any(tag in err for tag in ("{{", "[Op:", "name:")), err


def test_a_cause_ending_in_a_bracket_keeps_it():
  """Only an assertion's brackets are TensorFlow's: "Incompatible shapes: [3] vs. [4]" is the cause, whole."""
  shapes = tf.data.Dataset.from_generator(lambda: iter([np.ones(3, np.float32)]),
                                          output_signature=tf.TensorSpec([None], tf.float32))
  try:
    for _ in shapes.map(lambda x: x + tf.ones([4])):
      pass
  except tf.errors.OpError as e:
    summary, _ = exits.input_failure(e)
  assert summary == "the input pipeline failed: Incompatible shapes: [3] vs. [4]"
  assert exits.tf_cause("{{function_node f}} assertion failed: [example 5 is truncated]\n\t [[{{node Assert}}]]") == (
      "example 5 is truncated")


@pytest.mark.parametrize("link", ["context", "cause"])
def test_an_error_raised_after_an_input_failure_is_named_itself_as_one_input_line(link, capsys):
  """A cleanup that fails while the input's failure is handled (or an error raised from it) is an input failure
  too, named by its own type, message and line."""
  try:
    try:
      raise _worker_failure()
    except tf.errors.OpError as e:
      if link == "context":
        raise RuntimeError("the cleanup failed too")  # noqa: B904  (the implicit chain is the point)
      failure = e
    raise RuntimeError("the cleanup failed too") from failure
  except RuntimeError as e:
    error = e
  exits.report(error)
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith("error: an input worker failed: RuntimeError: the cleanup failed too "
                                             f"(at {os.path.relpath(__file__)}:"), err


def test_other_errors_are_not_input_failures_and_keep_their_traceback(capsys):
  try:
    raise KeyError("a bug")
  except KeyError as e:
    assert exits.input_failure(e) is None
    exits.report(e)
  err = capsys.readouterr().err
  assert err.startswith("Traceback (most recent call last):") and "KeyError: 'a bug'" in err and "error:" not in err


class _Held:
  """Stands for what a failed step's frames hold (an input iterator with calls in flight)."""


def _raise_holding(kept: list) -> None:
  held = _Held()
  kept.append(weakref.ref(held))
  raise ValueError("the input failed")


@pytest.mark.parametrize("link", ["context", "cause"])
def test_release_frees_what_the_frames_of_every_chained_error_hold(link):
  """A cleanup that fails while an input failure is handled raises a new error: the failure's frames, which hold
  the input stream, hang off that error's `__context__` (or `__cause__`), not off its own traceback."""
  kept: list = []

  def cleanup_fails() -> None:
    try:
      _raise_holding(kept)
    except ValueError as e:
      if link == "context":
        raise RuntimeError("the cleanup failed too")  # noqa: B904  (the implicit chain is the point)
      failure = e
    raise RuntimeError("a later step failed") from failure  # Outside the handler: a cause, and no context.

  try:
    cleanup_fails()
  except RuntimeError as e:
    error = e
  exits.release(error)
  gc.collect()
  assert kept[0]() is None, "a frame of a chained error still holds what it referenced"


def test_exit_runs_the_atexit_handlers_and_flushes_before_it_ends():
  """`exit` skips the interpreter's teardown, never the process's cleanup: JAX's shutdown is an atexit handler."""
  script = textwrap.dedent("""
      import atexit, sys
      from jaxdp.runtime import exits
      atexit.register(lambda: print("atexit ran", file=sys.stderr))
      print("unflushed", end="")
      exits.exit(5)
  """)
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
  assert (proc.returncode, proc.stdout, proc.stderr) == (5, "unflushed", "atexit ran\n")


def test_a_host_read_failing_in_any_of_jaxdps_packages_keeps_its_traceback():
  """jaxdp's own code is the whole package (its data code included), not only the module's own folder."""
  from jaxdp.report import units
  try:
    try:
      units.duration("not seconds")  # Raises in jaxdp/report/, outside jaxdp/runtime/.
    except TypeError as e:
      raise exits.InputFailure("a read failed") from e
  except exits.InputFailure as e:
    summary, kept = exits.input_failure(e)
  assert summary.startswith("an input worker failed: TypeError: ") and "units.py" in summary, summary
  assert kept.startswith("Traceback (most recent call last):"), kept
