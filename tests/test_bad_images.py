"""Bad images never lose a run: found when preparing (one `error:` line naming the file, exit 2), named by split
and index when met in training or eval, every completed step kept, and skipped (counted) on request."""

import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

import bad_datasets  # noqa: F401  `bad_datasets:BadJpegs`.
import runs
from jaxdp import checkpoint, data, train
from jaxdp.report import metrics

CLASSES = ("ant", "bee")
TIMEOUT = 240  # A run here takes seconds; a hang (the process never exits) fails instead of blocking the suite.


def truncated_jpeg(seed: int = 0) -> bytes:
  """A valid JPEG cut in half: its header opens, its pixels do not decode."""
  out = io.BytesIO()
  Image.fromarray(np.random.RandomState(seed).randint(0, 255, (48, 48, 3), np.uint8)).save(out, "JPEG")
  return out.getvalue()[:len(out.getvalue()) // 2]


def image_folder(root, bad: dict[str, bytes], per_class: int = 6) -> str:
  """train/ and test/ class subfolders of tiny JPEGs, plus the `bad` files ({relative path: bytes})."""
  rng = np.random.RandomState(0)
  for split, n in (("train", per_class), ("test", 2)):
    for c in CLASSES:
      os.makedirs(os.path.join(root, split, c), exist_ok=True)
      for i in range(n):
        Image.fromarray(rng.randint(0, 255, (10 + i, 12, 3), np.uint8)).save(os.path.join(root, split, c, f"{i}.jpg"))
  for rel, content in bad.items():
    with open(os.path.join(root, rel), "wb") as f:
      f.write(content)
  return str(root)


def train_cli(tmp_path, **overrides) -> subprocess.CompletedProcess:
  """`python -m jaxdp.train` with `overrides`, 2 CPU devices, a few steps of an MLP on 8x8 crops."""
  flags = runs.flags({"dataset.data_dir": str(tmp_path / "tfds"), "dataset.image_size": 8,
                      "model.name": "mlp", "model.hidden": "(8,)", "batch_size": 4, "eval_batch_size": 4,
                      "num_train_steps": 3, "log_every_steps": 1, "eval_every_steps": 3, "checkpoint_every_steps": 1,
                      **overrides})
  return subprocess.run([sys.executable, "-m", "jaxdp.train", *flags, "--workdir", str(tmp_path / "run")],
                        capture_output=True, text=True, timeout=TIMEOUT, env=_env())


def _env() -> dict:
  """This environment, 2 CPU devices, and tests/ importable (for `bad_datasets:BadJpegs`)."""
  env = {**os.environ, "JAXDP_CPU_DEVICES": "2",
         "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
  return env


def _error_lines(proc: subprocess.CompletedProcess) -> list[str]:
  return [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("rel, content, why", [
    ("test/bee/cut.jpg", truncated_jpeg(), "truncated"),
    ("train/ant/garbage.jpg", b"this is not an image at all\n" * 4, "does not open"),
])
def test_a_bad_file_in_an_image_folder_is_one_error_naming_it(tmp_path, rel, content, why):
  root = image_folder(tmp_path / "photos", {rel: content})
  proc = train_cli(tmp_path, **{"dataset.name": root})
  assert proc.returncode == 2, proc.stdout + proc.stderr
  errors = _error_lines(proc)
  assert len(errors) == 1 and repr(rel) in errors[0] and why in errors[0], errors
  assert "Traceback" not in proc.stdout + proc.stderr


def _bad_jpegs_config(tmp_path, **overrides):
  """A few steps on `bad_datasets:BadJpegs` (8x8 crops, an MLP, 2 devices), checkpoints every 2 steps."""
  return runs.config_with({"dataset.name": "bad_datasets:BadJpegs", "dataset.data_dir": str(tmp_path / "tfds"),
                           "dataset.image_size": 8, "model.name": "mlp", "model.hidden": (8,), "batch_size": 16,
                           "eval_batch_size": 16, "num_train_steps": 4, "log_every_steps": 2, "eval_every_steps": 4,
                           "checkpoint_every_steps": 2, "parallel.num_devices": 2,
                           **overrides})


def _undecodable(config, split: str) -> list[int]:
  """The indices in `split` whose image PIL cannot decode (found independently of jaxdp's pipeline)."""
  builder = data.load(config.dataset).builder
  source = builder.as_data_source(split, decoders={"image": tfds.decode.SkipDecoding()})
  bad = []
  for i in range(len(source)):
    try:
      Image.open(io.BytesIO(source[i]["image"])).load()
    except OSError:
      bad.append(i)
  return bad


def test_a_bad_example_in_the_final_eval_keeps_every_completed_step(tmp_path):
  config = _bad_jpegs_config(tmp_path, **{"dataset.builder_kwargs": {"bad_test": (3,)}})
  [index] = _undecodable(config, "test")
  with pytest.raises(data.BadExampleError, match=rf"cannot decode example {index} of split 'test' \(jpeg::"):
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert checkpoint.Checkpointer(str(tmp_path / "run"), config).manager.all_steps() == [2, 4]


def test_a_bad_train_example_is_one_error_naming_split_and_index(tmp_path):
  config = _bad_jpegs_config(tmp_path, **{"dataset.name": "bad_datasets:BadTrainJpegs"})
  [index] = _undecodable(config, "train")
  overrides = {"dataset.name": "bad_datasets:BadTrainJpegs", "batch_size": 16, "num_train_steps": 8,
               "eval_every_steps": 8}
  proc = train_cli(tmp_path, **overrides)
  assert proc.returncode == 2, proc.stdout + proc.stderr
  errors = _error_lines(proc)
  assert len(errors) == 1 and f"cannot decode example {index} of split 'train'" in errors[0], errors
  assert "Traceback" not in proc.stdout + proc.stderr


def _global_batches(config, process_count: int, steps: int) -> list[dict]:
  """Global train batches 0..steps-1, each process's rows read on their own and put together."""
  ds = data.load(config.dataset)
  per = [[next(it) for _ in range(steps)] for it in (
      data.train_batches(ds, "train", seed=0, global_batch=16, start_step=0, process_index=p,
                         process_count=process_count) for p in range(process_count))]
  return [{k: np.concatenate([pp[s][k] for pp in per]) for k in per[0][s]} for s in range(steps)]


def test_skipped_examples_are_replaced_the_same_way_on_any_process_count(tmp_path):
  config = _bad_jpegs_config(tmp_path, **{"dataset.builder_kwargs": {"bad_train": (5, 17)},
                                          "dataset.skip_bad_examples": True})
  one = _global_batches(config, 1, 8)  # Two epochs: each bad example met twice.
  runs.assert_bitwise(one, _global_batches(config, 1, 8))
  runs.assert_bitwise(one, _global_batches(config, 2, 8))
  runs.assert_bitwise(one, _global_batches(config, 4, 8))


def test_with_skipping_on_the_run_finishes_and_counts_the_bad_examples(tmp_path):
  config = _bad_jpegs_config(tmp_path, **{"dataset.builder_kwargs": {"bad_train": (5, 17), "bad_test": (3,)},
                                          "dataset.skip_bad_examples": True, "num_train_steps": 8,
                                          "log_every_steps": 4, "eval_every_steps": 8})
  result = train.train_and_evaluate(config, str(tmp_path / "run"))
  assert int(result.backend.get(result.state.step)) == 8
  assert result.eval_metrics["eval/num_examples"] == 19  # The bad test example is left out of the eval.
  logged = [r for r in metrics.read(str(tmp_path / "run")) if "train/skipped_examples" in r]
  assert [r["train/skipped_examples"] for r in logged] == [2.0, 4.0]  # 8 steps of 16 = 2 epochs of 64.


def test_the_count_of_skipped_examples_goes_on_over_a_resume(tmp_path):
  """Steps 1..4 and 5..8 each meet both bad examples; a resume from step 4 counts on from step 4's count."""
  config = _bad_jpegs_config(tmp_path, **{"dataset.builder_kwargs": {"bad_train": (5, 17)},
                                          "dataset.skip_bad_examples": True, "num_train_steps": 8,
                                          "log_every_steps": 4, "eval_every_steps": 8, "checkpoint_every_steps": 4})
  train.train_and_evaluate(config, str(tmp_path / "run"))
  shutil.rmtree(tmp_path / "run" / "checkpoints" / "8")  # As if a kill cut its save off: the run resumes at 4.
  train.train_and_evaluate(config, str(tmp_path / "run"))
  logged = [r for r in metrics.read(str(tmp_path / "run")) if "train/skipped_examples" in r]
  assert [(r["step"], r["train/skipped_examples"]) for r in logged] == [(4, 2.0), (8, 4.0), (8, 4.0)]


def test_the_count_of_skipped_examples_is_over_every_process(tmp_path):
  """Example 5 is met once per epoch, in either process's half of its step: the count is the run's, not process 0's."""
  flags = runs.flags({"dataset.name": "bad_datasets:BadTrainJpegs", "dataset.data_dir": str(tmp_path / "tfds"),
                      "dataset.image_size": 8, "dataset.skip_bad_examples": True, "model.name": "mlp",
                      "model.hidden": "(8,)", "batch_size": 16, "eval_batch_size": 16, "num_train_steps": 16,
                      "log_every_steps": 4, "eval_every_steps": 16, "checkpoint_every_steps": 0})
  proc = subprocess.run([sys.executable, "-m", "jaxdp.launch", "--num_processes", "2", "--devices_per_process", "1",
                         "--", *flags, "--workdir", str(tmp_path / "run")],
                        capture_output=True, text=True, timeout=TIMEOUT, env=_env())
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  logged = [r["train/skipped_examples"] for r in metrics.read(str(tmp_path / "run")) if "train/skipped_examples" in r]
  assert logged == [1.0, 2.0, 3.0, 4.0], logged  # 16 steps of 16 = 4 epochs of 64.


def test_with_skipping_on_an_image_folder_leaves_bad_files_out_and_says_so(tmp_path, caplog):
  root = image_folder(tmp_path / "photos", {"test/bee/cut.jpg": truncated_jpeg(),
                                            "train/ant/garbage.jpg": b"not an image\n"})
  config = runs.config_with({"dataset.name": root, "dataset.data_dir": str(tmp_path / "tfds"),
                             "dataset.image_size": 8, "dataset.skip_bad_examples": True, "model.name": "mlp",
                             "model.hidden": (8,), "batch_size": 4, "eval_batch_size": 4, "num_train_steps": 3,
                             "log_every_steps": 3, "eval_every_steps": 3, "checkpoint_every_steps": 0,
                             "parallel.num_devices": 2})
  with caplog.at_level("WARNING", logger="jaxdp"):
    result = train.train_and_evaluate(config, str(tmp_path / "run"))
  assert int(result.backend.get(result.state.step)) == 3
  assert result.eval_metrics["eval/num_examples"] == 4  # 2 per class; the truncated one left out.
  builder = data.load(config.dataset).builder
  assert {s: builder.info.splits[s].num_examples for s in ("train", "test")} == {"train": 12, "test": 4}
  lines = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
  assert any("left out 1 file(s)" in m and "test/bee/cut.jpg" in m for m in lines), lines
  assert any("left out 1 file(s)" in m and "train/ant/garbage.jpg" in m for m in lines), lines
