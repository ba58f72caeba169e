"""End-to-end training: device-count and backend equivalence, identical replicas, user models."""

import glob
import os
import subprocess
import sys
import textwrap
import time

import batches
import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache
import numpy as np
import pytest
import runs

from jaxdp import checkpoint, data, evaluation, feed, train
from jaxdp.runtime import process
from jaxdp.loop import hooks
from jaxdp.tools import sample
from jaxdp.report import metrics, progress
from jaxdp.loop import preemption, step_metrics
from jaxdp.configs import gpt_text_file


def _params(result):
  return result.backend.get(result.state.params)


def _assert_trees_close(a, b, **tol):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, **tol), a, b)


@pytest.fixture
def twenty_steps(config):
  config.num_train_steps = 20
  config.log_every_steps = 10
  config.learning_rate = 1e-3
  return config


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_eight_devices_train_like_one(twenty_steps, tmp_path, backend):
  twenty_steps.parallel.backend = backend
  twenty_steps.parallel.num_devices = 1
  one = _params(train.train_and_evaluate(twenty_steps, str(tmp_path / "one")))
  twenty_steps.parallel.num_devices = 8
  eight = _params(train.train_and_evaluate(twenty_steps, str(tmp_path / "eight")))
  _assert_trees_close(one, eight, rtol=1e-5, atol=1e-6)


def test_pmap_and_mesh_give_the_same_parameters(twenty_steps, tmp_path):
  results = {}
  for backend in ("pmap", "mesh"):
    twenty_steps.parallel.backend = backend
    results[backend] = _params(train.train_and_evaluate(twenty_steps, str(tmp_path / backend)))
  _assert_trees_close(results["pmap"], results["mesh"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["mesh", "pmap"])
def test_all_replicas_hold_identical_parameters_and_the_result_one_host_copy(config, tmp_path, backend):
  config.parallel.backend = backend
  config.model.name = "user_models:LinenBNNet"  # BatchNorm state must stay identical too.
  del config.model.hidden
  result = train.train_and_evaluate(config, str(tmp_path))
  replicas = result.backend.replicas({"params": result.state.params, "model_state": result.state.model_state})
  for leaf in jax.tree.leaves(replicas):
    assert leaf.shape[0] == 8
    for r in range(1, 8):
      np.testing.assert_array_equal(leaf[r], leaf[0])
  # Result.params / model_state: one host copy, without pmap's device axis (what sample_text takes).
  params, model_state = jax.eval_shape(result.model.init, jax.random.PRNGKey(0))
  for got, expected in ((result.params, params), (result.model_state, model_state)):
    assert jax.tree.map(np.shape, got) == jax.tree.map(lambda x: x.shape, expected)
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(got))


@pytest.mark.parametrize("name, extra", [("user_models:LinenBNNet", {"width": 16}),
                                         ("user_models:NNXNet", {"in_features": 64})])
def test_user_models_of_either_api_train(config, tmp_path, name, extra):
  config.model = type(config.model)({"name": name, **extra})
  config.num_train_steps = 30
  config.log_every_steps = 10
  config.learning_rate = 1e-2
  train.train_and_evaluate(config, str(tmp_path))
  losses = [r["train/loss"] for r in metrics.read(str(tmp_path)) if "train/loss" in r]
  assert losses[-1] < 0.7 * losses[0]


def test_metrics_jsonl_has_the_contract_keys(config, tmp_path):
  """Logs, evals and checkpoints every so many steps, and at the last step whatever its number."""
  config.num_train_steps, config.eval_every_steps, config.checkpoint_every_steps = 5, 2, 3
  train.train_and_evaluate(config, str(tmp_path))
  records = metrics.read(str(tmp_path))
  assert all("step" in r for r in records)
  assert [r["step"] for r in records if "train/loss" in r] == [2, 4, 5]
  evals = [r for r in records if "eval/loss" in r]
  assert [r["step"] for r in evals] == [2, 4, 5]
  assert checkpoint.steps(str(tmp_path)) == [3, 5]
  assert all({"eval/accuracy", "eval/num_examples"} <= set(r) for r in evals)
  assert evals[-1]["eval/num_examples"] == 360 and all(r["time/eval"] > 0 for r in evals)


def _record_closes(monkeypatch, *classes) -> list[str]:
  """Names of the classes whose `close` was called, in call order."""
  closed = []
  for cls in classes:
    def close(self, _original=cls.close, _name=cls.__name__):
      closed.append(_name)
      return _original(self)
    monkeypatch.setattr(cls, "close", close)
  return closed


def _boom(*args, **kwargs):
  raise RuntimeError("boom")


@pytest.mark.parametrize("how", ["exception", "preemption", "restore"])
def test_every_way_out_closes_the_writers_the_display_and_the_checkpointer(config, tmp_path, monkeypatch, how):
  closed = _record_closes(monkeypatch, hooks.Hooks, progress.Reporter, checkpoint.Checkpointer)
  config.eval_every_steps = 2
  if how == "preemption":
    monkeypatch.setattr(preemption.Watcher, "should_stop", lambda self, step: step == 2)
    assert train.train_and_evaluate(config, str(tmp_path)).preempted
  else:
    monkeypatch.setattr(*((evaluation, "exact") if how == "exception" else (checkpoint.Checkpointer, "restore_or_init")),
                        _boom)
    with pytest.raises(RuntimeError, match="boom"):
      train.train_and_evaluate(config, str(tmp_path))
  expected = {"Checkpointer"} if how == "restore" else {"Hooks", "Reporter", "Checkpointer"}
  assert set(closed) == expected
  if how != "restore":  # The train line of step 2 reached TensorBoard's files.
    assert [s for s, _ in runs.read_tensorboard(str(tmp_path))["train/loss"]] == [2]


def test_a_run_stopped_inside_its_profiled_steps_ends_as_a_finished_one(config, tmp_path, monkeypatch):
  """The trace of the steps profiled so far, the run's time record at the stop, and no input thread left behind."""
  monkeypatch.setattr(preemption.Watcher, "should_stop", lambda self, step: step == 3)
  config.profile_steps, config.num_train_steps = (2, 4), 100
  monkeypatch.setattr(feed, "BLOCK_MIB", 0)  # One step a transfer: the thread still has batches to read at the stop.
  before = runs.prefetch_threads()  # Other tests' runs may still be letting theirs go.
  assert train.train_and_evaluate(config, str(tmp_path)).preempted
  assert glob.glob(str(tmp_path / "plugins" / "profile" / "*" / "*.xplane.pb"))
  last = metrics.read(str(tmp_path))[-1]
  assert last["step"] == 3 and last["time/total/wall"] > 0, last
  assert runs.prefetch_threads() <= before


def test_checkpoint_saves_are_timed_apart_from_the_steps(config, tmp_path, monkeypatch):
  config.num_train_steps, config.log_every_steps, config.checkpoint_every_steps = 8, 4, 4
  monkeypatch.setattr(checkpoint.Checkpointer, "save", lambda self, *a, **k: time.sleep(1.0))  # A slow save.
  train.train_and_evaluate(config, str(tmp_path))
  records = metrics.read(str(tmp_path))
  saves = [r for r in records if "time/checkpoint" in r]
  assert [r["step"] for r in saves] == [4, 8] and all(r["time/checkpoint"] >= 1.0 for r in saves)
  logs = {r["step"]: r for r in records if "perf/step_time" in r}
  assert set(logs) == {4, 8}
  # Steps 5..8 are timed from the log at 4 to the log at 8, and the save after step 4 falls between: counted, it
  # would make their time the whole wall between the two logs. The rest of that wall (the steps, the replica check's
  # first compile) depends on the machine's load; the save's sleep does not.
  wall = logs[8]["time/total/wall"] - logs[4]["time/total/wall"]
  assert 4 * logs[8]["perf/step_time"] < wall - saves[0]["time/checkpoint"] + 0.5, (logs, saves)


@pytest.fixture(scope="module")
def text_path(tmp_path_factory) -> str:
  path = tmp_path_factory.mktemp("text") / "abc.txt"
  path.write_text("the quick brown fox jumps over the lazy dog. " * 40)
  return str(path)


def test_sample_text_takes_what_a_pmap_run_returns(tmp_path):
  """The documented call, on the backend whose device state has a leading device axis."""
  text_path = tmp_path / "abc.txt"
  text_path.write_text("the quick brown fox jumps over the lazy dog. " * 40)
  config = gpt_text_file.get_config()
  config.model.update(num_layers=1, num_heads=2, embed_dim=16, mlp_ratio=2)
  config.dataset.data_dir = str(tmp_path / "tfds")
  config.dataset.builder_kwargs.update(path=str(text_path), seq_len=16, stride=16)
  config.batch_size, config.eval_batch_size, config.num_train_steps = 16, 16, 2
  config.log_every_steps, config.eval_every_steps, config.checkpoint_every_steps = 2, 1000, 0
  config.warmup_steps = 1
  config.parallel.backend, config.parallel.num_devices = "pmap", 2
  result = train.train_and_evaluate(config, str(tmp_path / "run"))
  text = sample.sample_text(result.model, result.params, result.model_state, "the ", 8, seq_len=16, temperature=0)
  assert text.startswith("the ") and 4 < len(text) <= 12  # Sampled bytes decode to at most one character each.


def test_the_python_api_writes_jaxdps_compilation_cache_after_jax_compiled(config, tmp_path, monkeypatch):
  before = jax.config.jax_compilation_cache_dir
  monkeypatch.setattr(process, "DEFAULT_CACHE_DIR", str(tmp_path / "xla"))
  jax.config.update("jax_compilation_cache_dir", None)  # No JAX_COMPILATION_CACHE_DIR: jaxdp's directory.
  jax_cache.reset_cache()  # As a process that never had a cache directory (this one's was conftest's).
  jax.jit(lambda x: x * 3 + 1)(np.float32(2)).block_until_ready()  # As in a notebook: JAX's cache is open already.
  config.model.hidden = (23,)  # A program no other test compiled: JAX's in-memory cache cannot serve it.
  config.num_train_steps = 1
  try:
    train.train_and_evaluate(config, str(tmp_path / "run"))
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")
  finally:
    jax.config.update("jax_compilation_cache_dir", before)
    jax_cache.reset_cache()
  assert os.listdir(tmp_path / "xla"), "no cache entry written"


def _failing_stream(monkeypatch, at_step: int, error: Exception | None = None, nan_steps: set[int] = frozenset()):
  """The train stream, NaN inputs at `nan_steps`, and `error` raised when batch `at_step` is asked for."""
  real = data.train_batches

  def stream(*args, start_step: int, **kwargs):
    for step, batch in enumerate(batches.nan_inputs_at(real(*args, start_step=start_step, **kwargs), nan_steps,
                                                       start_step), start_step):
      if step == at_step and error is not None:
        raise error
      yield batch

  monkeypatch.setattr(data, "train_batches", stream)


@pytest.mark.parametrize("every, kept", [(4, [4, 5]), (0, [])])  # Checkpointing off: nothing saved either.
def test_an_error_in_the_input_keeps_the_last_completed_step(config, tmp_path, monkeypatch, every, kept):
  _failing_stream(monkeypatch, 5, OSError("disk gone"))  # Batch 5 is step 6's.
  config.num_train_steps, config.checkpoint_every_steps = 10, every
  with pytest.raises(OSError, match="disk gone"):
    train.train_and_evaluate(config, str(tmp_path))
  assert checkpoint.steps(str(tmp_path)) == kept


def test_a_save_failing_on_the_way_out_leaves_the_first_error_to_report(config, tmp_path, monkeypatch, caplog):
  _failing_stream(monkeypatch, 5, OSError("disk gone"))
  config.num_train_steps, config.checkpoint_every_steps = 10, 4
  save = checkpoint.Checkpointer.save

  def full_disk(self, step, *args, **kwargs):
    if step != 4:  # The save on the way out (step 5); the periodic one at step 4 is written.
      raise OSError("no space left")
    return save(self, step, *args, **kwargs)

  monkeypatch.setattr(checkpoint.Checkpointer, "save", full_disk)
  with pytest.raises(OSError, match="disk gone"):
    train.train_and_evaluate(config, str(tmp_path))
  assert "step 5: could not checkpoint before stopping: no space left" in caplog.text
  assert checkpoint.steps(str(tmp_path)) == [4]


def test_a_nonfinite_stop_saves_no_checkpoint_on_the_way_out(config, tmp_path, monkeypatch):
  _failing_stream(monkeypatch, -1, nan_steps={5, 6})
  config.num_train_steps, config.log_every_steps, config.checkpoint_every_steps = 10, 8, 4
  monkeypatch.setattr(step_metrics, "MAX_CONSECUTIVE_NONFINITE", 2)
  with pytest.raises(train.NonFiniteError):
    train.train_and_evaluate(config, str(tmp_path))
  assert checkpoint.Checkpointer(str(tmp_path), config).manager.all_steps() == [4]


# A failing read (example 50, in a tf.data worker), then reads kept in flight well past the error (the guard's
# re-reads of the failed step, in the prefetch thread, stay fast: they are not what this test is about).
_SLOW_AFTER_FAILING = textwrap.dedent("""
    import threading, time
    import failing_datasets

    class _Records(failing_datasets._FailingRecords):
      failed = False

      def __getitems__(self, keys):
        reader = threading.current_thread()  # A tf.data worker: not the loop's thread, nor jaxdp's prefetch thread.
        if _Records.failed and reader is not threading.main_thread() and reader.name != "jaxdp-prefetch":
          time.sleep(2.0)  # Still running when the caller holds the error.
        _Records.failed = _Records.failed or failing_datasets.BAD_INDEX in keys
        return super().__getitems__(keys)

    class SlowAfterFailing(failing_datasets.FailingReadBlobs):
      def as_data_source(self, split, **kwargs):
        records = super(failing_datasets.FailingReadBlobs, self).as_data_source(split, **kwargs)
        return _Records(records, ValueError) if split == "train" else records
""")

# As a notebook does: train_and_evaluate raises, the error is kept (sys.last_value), then Python exits.
_KEEP_THE_ERROR = textwrap.dedent("""
    import sys
    from jaxdp import train
    from jaxdp.configs import default
    config = default.get_config()
    config.dataset.name, config.dataset.data_dir, config.dataset.cache_mb = "slow_failing:SlowAfterFailing", sys.argv[2], 0
    config.model.name, config.batch_size, config.num_train_steps, config.eval_every_steps = "mlp", 32, 20, 1000
    try:
      train.train_and_evaluate(config, sys.argv[1])
    except Exception as e:
      kept = e
      print("raised", type(e).__name__)
""")


def test_an_error_kept_by_the_caller_does_not_hold_python_at_exit(tmp_path):
  """train_and_evaluate releases the error's frames as the CLI does: the input stream is not deleted at exit."""
  (tmp_path / "slow_failing.py").write_text(_SLOW_AFTER_FAILING)
  tests = os.path.dirname(os.path.abspath(__file__))
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), tests, os.environ.get("PYTHONPATH", "")])}
  command = [sys.executable, "-c", _KEEP_THE_ERROR, str(tmp_path / "run"), str(tmp_path / "tfds")]
  try:  # Without the release the process printed its line, then waited forever (0% CPU) at exit.
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
  except subprocess.TimeoutExpired as e:
    pytest.fail(f"the process did not exit within 120 s; its output:\n{e.output}\n{e.stderr}")
  assert proc.returncode == 0 and "raised InvalidArgumentError" in proc.stdout, proc.stdout + proc.stderr
