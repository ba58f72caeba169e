"""No exception leaves a process hanging, and a failing input worker is one `error:` line (issue 22 items 1, 6).

A tf.data iterator with worker calls in flight, still referenced by an exception's traceback when the
interpreter shuts down, waits forever for those calls (they can no longer take the GIL): the process
printed its error, then sat at 0% CPU until killed.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from jaxdp.configs import default

TESTS = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 120  # A run that ends takes seconds; one that hangs never ends.
TFDS_CHATTER = ("Variant folder", "Using custom data configuration", "Downloading and preparing",
                "downloaded and prepared")


def _python(args: list[str], **env: str) -> subprocess.CompletedProcess:
  """Runs python with `args`, tests/ importable; a hang fails the test at TIMEOUT_S instead of blocking it."""
  full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]), **env}
  full_env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # As a user's shell has it (JAX's import, in this process, sets it).
  try:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full_env, timeout=TIMEOUT_S)
  except subprocess.TimeoutExpired as e:
    pytest.fail(f"the process did not exit within {TIMEOUT_S} s; its output:\n{e.output}\n{e.stderr}")


def test_a_failing_input_worker_ends_the_run_with_one_line(tmp_path):
  """The read of example 50 raises inside a tf.data worker: one `error:` line naming it, exit 1, 3 of 3 runs."""
  for run in range(3):
    proc = _python(["-m", "jaxdp.train", "--config", default.__file__, "--workdir", str(tmp_path / f"run{run}"),
                    "--config.dataset.name=failing_datasets:FailingReadBlobs",
                    f"--config.dataset.data_dir={tmp_path / 'tfds'}", "--config.dataset.cache_mb=0",
                    "--config.model.name=mlp", "--config.batch_size=32", "--config.num_train_steps=20",
                    "--config.eval_every_steps=1000"], JAXDP_CPU_DEVICES="1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "cannot read example 50" in errors[0] and "failing_datasets.py" in errors[0], out
    assert "Traceback" not in out, out  # The user's dataset code failed: its one line, not 40.
    assert not [line for line in out.splitlines() if any(c in line for c in TFDS_CHATTER)], out  # Run 0 prepares.


# An input stream with calls in flight fails; the error is handled as the CLI handles it, then Python exits.
_IN_FLIGHT = textwrap.dedent("""
    import sys, time
    from jaxdp.tools import cli
    import numpy as np
    import tensorflow as tf

    def read(step):
      time.sleep(0.01)
      if step >= 5:
        raise ValueError(f"bad step {step}")
      return np.full([4], step, np.int64)

    def run():
      stream = tf.data.Dataset.range(1000).map(
          lambda s: tf.numpy_function(read, [s], tf.int64, stateful=False), num_parallel_calls=8).prefetch(2)
      for _ in stream:
        pass

    sys.exit(cli.guarded(run))
""")


@pytest.mark.parametrize("attempt", range(3))
def test_an_error_handled_by_the_cli_frees_its_input_stream_before_python_exits(attempt):
  """`cli.guarded` releases the error's frames: the stream is deleted while Python runs, and exit is prompt."""
  proc = _python(["-c", _IN_FLIGHT])
  assert proc.returncode == 1, proc.stderr
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and errors[0].startswith("error: an input worker failed: ValueError: bad step"), proc.stderr


def test_exit_ends_the_process_despite_a_thread_that_never_returns():
  """A non-daemon thread blocked forever (a consumer gone) holds a plain exit; `exits.exit` ends it after a grace."""
  script = textwrap.dedent("""
      import threading
      from jaxdp.runtime import exits
      exits.THREAD_GRACE_S = 0.5
      threading.Thread(target=threading.Event().wait, name="stuck-producer").start()
      exits.exit(3)
  """)
  proc = _python(["-c", script])
  assert proc.returncode == 3 and "stuck-producer" in proc.stderr, proc.stderr


@pytest.mark.parametrize("module", ["jaxdp.train", "jaxdp.evaluate", "jaxdp.sample"])
def test_help_imports_neither_tensorflow_nor_jax(module):
  """`--help` prints the flags without loading TensorFlow, JAX or the loop (7.5 s before, for train)."""
  proc = _python(["-X", "importtime", "-m", module, "--help"])
  assert proc.returncode == 0 and "--config" in proc.stdout, proc.stderr
  imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
  assert not imported & {"tensorflow", "jax", "tensorflow_datasets", "flax"}, sorted(imported)


def test_no_libtpu_warnings_on_a_machine_without_tpus():
  """With the `tpu` extra installed, a CPU machine's JAX start printed libtpu's host-bounds and hostname lines; a
  command's first step (`cli.start`) turns them off (`import jaxdp` alone leaves the process as it is)."""
  import importlib.util
  if importlib.util.find_spec("libtpu") is None:
    pytest.skip("libtpu (the tpu extra) is not installed: it is what prints the warnings")
  env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
  proc = subprocess.run([sys.executable, "-c", "from jaxdp.tools import cli; cli.start(['jaxdp.train']); import jax; print(jax.devices()[0].platform)"],
                        capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
  assert proc.returncode == 0 and proc.stdout.strip() != "tpu", proc.stderr
  assert "host bounds" not in proc.stderr and "worker hostname" not in proc.stderr, proc.stderr
