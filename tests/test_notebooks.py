"""Every notebook in notebooks/ runs top to bottom on fake CPU devices with a small config, offline,
as on a first run: from a checkout, in a fresh kernel in which jaxdp is not importable.
"""

import json
import os
import pathlib
import shutil
import sys

import nbformat
import pytest
from nbclient import NotebookClient

REPO = pathlib.Path(__file__).parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
TIMEOUT_S = 120  # Per cell; each whole notebook takes well under a minute on 2 cores.

# The kernel's sitecustomize: drop the editable install's import hook (how CI and the dev venv install
# jaxdp), so `import jaxdp` fails there until the notebook makes its checkout importable.
HIDE_INSTALLED_JAXDP = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable___jaxdp" not in getattr(f, "__module__", "")]
"""


def _first_run_checkout(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
  """A copy of the checkout (elsewhere than the installed one) and a kernel environment without jaxdp."""
  checkout = tmp_path / "checkout"
  shutil.copytree(REPO / "jaxdp", checkout / "jaxdp", ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copytree(REPO / "notebooks", checkout / "notebooks")
  shutil.copy(REPO / "pyproject.toml", checkout)
  hide = tmp_path / "hide"
  hide.mkdir()
  (hide / "sitecustomize.py").write_text(HIDE_INSTALLED_JAXDP)
  monkeypatch.setenv("PYTHONPATH", str(hide))
  monkeypatch.delenv("JAXDP_REPO", raising=False)
  return checkout


def test_there_are_notebooks():
  assert {p.name for p in NOTEBOOKS} >= {"quickstart.ipynb", "data_parallelism.ipynb", "your_own_task.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, data_dir, tmp_path, monkeypatch):
  # The kernel inherits this environment: simulated CPU devices, the prepared offline data, few steps.
  monkeypatch.setenv("JAXDP_CPU_DEVICES", "4")
  monkeypatch.setenv("JAXDP_DATA_DIR", data_dir)
  monkeypatch.setenv("JAXDP_NOTEBOOK_STEPS", "12")
  monkeypatch.setenv("JAXDP_WORKDIR", str(tmp_path / "run"))
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  # The `python3` kernel spec may run plain `python`: make that this interpreter (the test venv).
  monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
  checkout = _first_run_checkout(tmp_path, monkeypatch)
  nb = nbformat.read(checkout / "notebooks" / path.name, as_version=4)
  client = NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                          resources={"metadata": {"path": str(checkout / "notebooks")}})  # Jupyter's working dir.
  client.execute()
  errors = [o for cell in nb.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
  assert not errors
  printed = "".join(o.get("text", "") for o in nb.cells[1].get("outputs", []))
  assert f"jaxdp from {checkout}\n" in printed  # Imported from the copy: the installed jaxdp was hidden.
  if path.name == "quickstart.ipynb":
    assert (tmp_path / "run" / "curves.png").stat().st_size > 10_000
    assert (tmp_path / "run" / "metrics.jsonl").exists()
  if path.name == "your_own_task.ipynb":  # The notebook's own task reached the metrics file, train and eval.
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*records)
    assert {"train/loss", "train/mse", "train/max_error", "eval/mse", "eval/mae", "eval/max_error"} <= keys, keys
    assert "train/accuracy" not in keys and "eval/accuracy" not in keys
    assert (tmp_path / "run" / "curves.png").stat().st_size > 10_000
