"""The scaling projection (benchmarks/projection.py): the alpha-beta arithmetic on fixed inputs, its `--project`
JSON, a bad interconnect name; `jaxdp.inspect --project` names where it moved."""

import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
import projection  # noqa: E402

from jaxdp.configs import mlp_digits  # noqa: E402
from jaxdp.tools import inspect  # noqa: E402

LINK = projection.Interconnect(1e9, 1e-5, "test: 1 GB/s, 10 us")


def test_ring_and_tree_allreduce_times():
  # Ring: 2 (N-1)/N * bytes / bandwidth + 2 (N-1) * latency per call.
  assert projection.ring_allreduce_s(4, 1e6, LINK) == pytest.approx(2 * 3 / 4 * 1e-3 + 2 * 3 * 1e-5)
  assert projection.ring_allreduce_s(4, 1e6, LINK, calls=3) == pytest.approx(1.5e-3 + 3 * 6e-5)
  # Tree: 2 * bytes / bandwidth + 2 ceil(log2 N) * latency per call.
  assert projection.tree_allreduce_s(8, 1e6, LINK) == pytest.approx(2e-3 + 2 * 3 * 1e-5)
  assert projection.tree_allreduce_s(5, 1e6, LINK) == pytest.approx(2e-3 + 2 * 3 * 1e-5)
  assert projection.ring_allreduce_s(1, 1e6, LINK) == projection.tree_allreduce_s(1, 1e6, LINK) == 0.0
  # Big buffers, few devices: the ring (less data); tiny buffers, many devices: the tree (fewer rounds).
  assert projection.allreduce_s(4, 1e9, LINK)[1] == "ring"
  assert projection.allreduce_s(512, 1e3, LINK)[1] == "tree"
  # ZeRO-1: reduce-scatter + all-gather = the ring all-reduce's bytes and latency rounds.
  zero1 = projection.reduce_scatter_all_gather_s(4, 1e6, LINK)
  assert zero1 == pytest.approx(projection.ring_allreduce_s(4, 1e6, LINK))


def test_model_efficiency_share_and_what_ifs():
  compute, batch, nbytes = 10e-3, 32, 4e6
  one, eight = projection.model([1, 8], compute, batch, nbytes, 1, LINK, accum=4)
  assert one["step_s"] == compute and one["efficiency"] == 1.0 and one["comm_share"] == 0.0
  assert one["samples_per_s"] == pytest.approx(batch / compute)
  ring = 2 * 7 / 8 * nbytes / 1e9 + 2 * 7 * 1e-5
  tree = 2 * nbytes / 1e9 + 2 * 3 * 1e-5
  comm = min(ring, tree)
  assert eight["comm_s"] == pytest.approx(comm) and eight["algorithm"] == "ring"
  assert eight["step_s"] == pytest.approx(compute + comm)
  assert eight["samples_per_s"] == pytest.approx(8 * batch / (compute + comm))
  assert eight["efficiency"] == pytest.approx(compute / (compute + comm))
  assert eight["comm_share"] == pytest.approx(comm / (compute + comm))
  w = eight["what_if"]
  bf16 = 2 * 7 / 8 * nbytes / 2 / 1e9 + 2 * 7 * 1e-5  # Half the bytes, the same latency.
  assert w["bf16_allreduce"]["step_s"] == pytest.approx(compute + bf16)
  assert w["grad_accum_4"]["step_s"] == pytest.approx(4 * compute + comm)  # One all-reduce per 4 micro-batches.
  assert w["grad_accum_4"]["samples_per_s"] == pytest.approx(8 * 4 * batch / (4 * compute + comm))
  assert w["grad_accum_4"]["efficiency"] == pytest.approx(4 * compute / (4 * compute + comm))
  assert w["zero1"]["step_s"] == pytest.approx(compute + 2 * (7 / 8 * nbytes / 1e9 + 7 * 1e-5))


def test_cli_json_keys(data_dir, capsys):
  status = projection.main(["projection.py", "--config", mlp_digits.__file__, f"--config.dataset.data_dir={data_dir}",
                            "--config.model.hidden=(16,)", "--config.batch_size=16", "--project", "1,8,64",
                            "--interconnect", "nvlink4", "--json"])
  assert status == 0
  r = json.loads(capsys.readouterr().out)
  assert r["interconnect"] == "nvlink4" and r["bytes_per_s"] == 450e9 and r["per_device_batch"] == 16
  # Gradients of an MLP 64 -> 16 -> 10: (64 * 16 + 16 + 16 * 10 + 10) float32, from the compiled all-reduce
  # (plus the step's metrics, which XLA may pack into one small vector: 8 bytes here).
  assert 0 <= r["gradient_bytes"] - 4 * (64 * 16 + 16 + 16 * 10 + 10) <= 16
  assert r["gradient_source"] == "compiled HLO on 2 devices" and r["allreduce_calls"] >= 1
  assert r["compute_s"] > 0 and math.isclose(r["compute_per_example_s"], r["compute_s"] / 16)
  assert [row["devices"] for row in r["rows"]] == [1, 8, 64]
  for row in r["rows"]:
    assert {"step_s", "samples_per_s", "efficiency", "comm_share", "comm_s", "algorithm", "global_batch"} <= set(row)
    assert set(row["what_if"]) == {"bf16_allreduce", "grad_accum_4", "zero1"}
  assert r["rows"][0]["efficiency"] == 1.0 and r["rows"][2]["efficiency"] < r["rows"][1]["efficiency"] < 1.0


@pytest.mark.parametrize("args", [["--project", "8", "--interconnect", "carrier-pigeon"],
                                  ["--project", "8,x"], ["--project"], ["--interconnect", "nvlink4"]])
def test_bad_flags_are_one_error_line(data_dir, args, capsys):
  status = projection.main(["projection.py", "--config", mlp_digits.__file__, f"--config.dataset.data_dir={data_dir}",
                            *args])
  out, err = capsys.readouterr()
  err = err.strip().splitlines()
  assert status == 2 and len(err) == 1 and err[0].startswith("error: ") and out == ""
  if "carrier-pigeon" in args:
    assert "'carrier-pigeon'" in err[0] and all(name in err[0] for name in projection.INTERCONNECTS)


@pytest.mark.parametrize("args", [["--project", "8"], ["--project=8,64"], ["--interconnect", "nvlink4"],
                                  ["--topology=h100:8", "--project=8"]])
def test_inspect_project_is_one_error_line_naming_where_it_moved(args, capsys):
  assert inspect.main(["inspect", "--config", mlp_digits.__file__, *args]) == 2
  out, err = capsys.readouterr()
  flag = next(a.split("=")[0] for a in args if a.startswith(("--project", "--interconnect")))
  assert out == "" and err.splitlines() == [
      f"error: {flag} moved to benchmarks/: python benchmarks/projection.py --project 8,64,512 "
      "[--interconnect NAME] --config CONFIG.py"]


def test_text_report_has_a_row_per_count():
  rows = projection.model([1, 64], 10e-3, 32, 4e6, 8, LINK)
  r = {"interconnect": "test", "bytes_per_s": 1e9, "latency_s": 1e-5, "per_device_batch": 32, "compute_s": 10e-3,
       "compute_per_example_s": 10e-3 / 32, "device_kind": "cpu", "gradient_bytes": 4e6, "allreduce_calls": 8,
       "gradient_source": "fixed", "grad_accum_what_if": projection.ACCUM, "rows": rows}
  lines = projection.format_report(r).splitlines()
  one = next(line for line in lines if line.split()[:1] == ["1"])
  many = next(line for line in lines if line.split()[:1] == ["64"])
  assert one.split()[1:4] == ["10", "3,200", "100.0%"]
  assert many.split()[3] == f"{rows[1]['efficiency']:.1%}" and many.split()[5] == rows[1]["algorithm"]
