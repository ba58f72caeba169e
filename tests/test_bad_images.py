"""Bad images never lose a run: found when preparing (one `error:` line naming the file, exit 2), named by split
and index when met in training or eval, every completed step kept, and skipped (counted) on request."""

import io
import json
import os
import subprocess

import numpy as np
import pytest
from PIL import Image

import runs

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


def train_cli(tmp_path, name: str, **overrides) -> subprocess.CompletedProcess:
  """`python -m jaxdp.train` on `name`, 2 CPU devices, a few steps of an MLP on 8x8 crops."""
  flags = runs.flags({"dataset.name": name, "dataset.data_dir": str(tmp_path / "tfds"), "dataset.image_size": 8,
                      "model.name": "mlp", "model.hidden": "(8,)", "batch_size": 4, "eval_batch_size": 4,
                      "num_train_steps": 3, "log_every_steps": 1, "eval_every_steps": 3, "checkpoint_every_steps": 1,
                      "check_replicas_every_steps": 0, "async_checkpointing": False, **overrides})
  return subprocess.run(runs.start("jaxdp.train", [*flags, "--workdir", str(tmp_path / "run")], devices=2).args,
                        capture_output=True, text=True, timeout=TIMEOUT, env=_env())


def _env() -> dict:
  env = {**os.environ, "JAXDP_CPU_DEVICES": "2"}
  env.pop("XLA_FLAGS", None)
  return env


def _error_lines(proc: subprocess.CompletedProcess) -> list[str]:
  return [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("rel, content, why", [
    ("test/bee/cut.jpg", truncated_jpeg(), "truncated"),
    ("train/ant/garbage.jpg", b"this is not an image at all\n" * 4, "does not open"),
])
def test_a_bad_file_in_an_image_folder_is_one_error_naming_it(tmp_path, rel, content, why):
  root = image_folder(tmp_path / "photos", {rel: content})
  proc = train_cli(tmp_path, root)
  assert proc.returncode == 2, proc.stdout + proc.stderr
  errors = _error_lines(proc)
  assert len(errors) == 1 and repr(rel) in errors[0] and why in errors[0], errors
  assert "Traceback" not in proc.stdout + proc.stderr
