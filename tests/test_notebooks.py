"""Every notebook in notebooks/ runs top to bottom on fake CPU devices with a small config, offline."""

import os
import pathlib
import sys

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
TIMEOUT_S = 120  # Per cell; each whole notebook takes well under a minute on 2 cores.


def test_there_are_notebooks():
  assert {p.name for p in NOTEBOOKS} >= {"quickstart.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, data_dir, tmp_path, monkeypatch):
  # The kernel inherits this environment: simulated CPU devices, the prepared offline data, few steps.
  monkeypatch.setenv("JAXDP_CPU_DEVICES", "4")
  monkeypatch.setenv("JAXDP_DATA_DIR", data_dir)
  monkeypatch.setenv("JAXDP_NOTEBOOK_STEPS", "12")
  monkeypatch.setenv("JAXDP_WORKDIR", str(tmp_path / "run"))
  monkeypatch.setenv("XLA_FLAGS", "")  # The notebook sets its own device count.
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  # The `python3` kernel spec may run plain `python`: make that this interpreter (the test venv).
  monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
  nb = nbformat.read(path, as_version=4)
  NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
  errors = [o for cell in nb.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
  assert not errors
  if path.name == "quickstart.ipynb":
    assert (tmp_path / "run" / "curves.png").stat().st_size > 10_000
    assert (tmp_path / "run" / "metrics.jsonl").exists()
