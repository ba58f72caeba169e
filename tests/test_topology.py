"""Ahead-of-time compilation for a TPU slice on this CPU machine (jaxdp.topology, `inspect --topology`)."""

import importlib.util
import json

import pytest
import runs

from jaxdp.tools import inspect, topology
from jaxdp.config import ConfigError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                reason="needs libtpu: pip install -e '.[tpu]' (CI's Python 3.11 job installs it; "
                                       "its job on the newest JAX does not)")

WIDTH, DEPTH = 20_000, 5  # An MLP of 1.6 billion parameters on digits (8x8 inputs, 10 classes).
P = 64 * WIDTH + WIDTH + (DEPTH - 1) * (WIDTH * WIDTH + WIDTH) + WIDTH * 10 + 10


def _big(data_dir, **more):
  return runs.config_with({"dataset.data_dir": data_dir, "model.name": "mlp", "model.hidden": (WIDTH,) * DEPTH,
                           "batch_size": 64, **more})


def test_default_config_fits_on_v5e_2x2(data_dir, capsys):
  status = inspect.main(["inspect", "--config", runs.default.__file__, f"--config.dataset.data_dir={data_dir}",
                         "--topology", "v5e:2x2", "--json"])
  assert status == 0
  r = json.loads(capsys.readouterr().out)
  assert r["topology"] == "v5e:2x2" and r["num_devices"] == 4 and r["device_kind"] == "TPU v5 lite"
  assert r["fits"] is True and r["device_memory_bytes"] == 16 * 2**30
  mem = r["memory"]
  assert r["per_device_bytes"] == mem["argument_bytes"] + mem["temp_bytes"] + mem["output_bytes"] - mem["alias_bytes"]
  assert r["margin_bytes"] == r["device_memory_bytes"] - r["per_device_bytes"]
  params = 151_306 * 4  # The CNN's gradients, all-reduced once (plus the scalar metrics).
  assert params <= r["collectives"]["all-reduce"]["bytes"] <= params + 64
  roof = r["roofline"]
  assert r["flops_per_step"] > 0 and roof["step_s"] == max(roof["compute_s"], roof["hbm_s"], roof["collectives_s"])
  assert roof["collectives_s"] == pytest.approx(2 * 3 / 4 * r["collectives"]["all-reduce"]["bytes"] / 200e9)


def test_a_billion_parameter_mlp_fits_only_with_zero1(data_dir):
  unsharded = topology.report(_big(data_dir), "v5e:2x2")
  assert unsharded["fits"] is False and unsharded["per_device_bytes"] > 16 * 2**30
  zero = topology.report(_big(data_dir, **{"parallel.shard_optimizer_state": True}), "v5e:4x4")
  assert zero["fits"] is True and zero["num_devices"] == 16
  n, mem = 16, zero["memory"]
  # Arguments: the parameters (P floats, replicated) and Adam's two moments sharded 16 ways, plus the batch.
  assert mem["argument_bytes"] == pytest.approx(4 * (P + 2 * P / n), rel=0.01)
  # Temporaries: the full gradient (P floats) before it is reduce-scattered, and the activations.
  assert 4 * P <= mem["temp_bytes"] <= 4 * P * 1.6
  # The gradients cross the chips. (libtpu 0.0.42.1 compiles both the reduce-scatter and the parameter all-gather
  # of this step as all-reduces: 2 x 4P bytes of all-reduce; the lowered program has the reduce-scatter.)
  assert sum(c["bytes"] for c in zero["collectives"].values()) >= 4 * P


def test_twenty_16384_wide_layers_fit_a_v5e_4x4_only_with_shard_params(data_dir):
  """5.1 B parameters (20.4 GB in float32): each chip holds 1/16 of them and of Adam's moments, plus what it gathers."""
  width, depth = 16_384, 20
  config = lambda **more: runs.config_with({"dataset.data_dir": data_dir, "model.name": "mlp",  # noqa: E731
                                            "model.hidden": (width,) * depth, "batch_size": 64, **more})
  params = 64 * width + width + (depth - 1) * (width * width + width) + width * 10 + 10
  sharded = topology.report(config(**{"parallel.shard_params": True}), "v5e:4x4")
  assert sharded["fits"] is True and sharded["num_devices"] == 16
  assert sharded["memory"]["argument_bytes"] == pytest.approx(4 * 3 * params / 16, rel=0.01)
  assert sharded["per_device_bytes"] < 16 * 2**30 < 4 * params  # Not even the parameters fit one chip whole.
  for more in ({}, {"parallel.shard_optimizer_state": True}):
    assert topology.report(config(**more), "v5e:4x4")["fits"] is False, more


@pytest.mark.parametrize("option", [{"grad_accum_steps": 2}, {"dtype": "bfloat16"},
                                    {"parallel.allreduce_dtype": "bfloat16"}, {"parallel.invariant": True},
                                    {"parallel.shard_optimizer_state": True}, {"parallel.shard_params": True}])
def test_memory_changing_options_compile_for_a_slice(data_dir, option):
  base = {"dataset.data_dir": data_dir, "model.name": "mlp", "model.hidden": (512,), "batch_size": 64}
  plain = topology.report(runs.config_with(base), "v5e:2x2")
  r = topology.report(runs.config_with({**base, **option}), "v5e:2x2")
  assert r["fits"] and r["num_devices"] == 4
  if "parallel.allreduce_dtype" in option:  # TPUs keep the bfloat16 all-reduce (XLA:CPU would promote it).
    assert r["collectives"]["all-reduce"]["bytes"] < 0.6 * plain["collectives"]["all-reduce"]["bytes"]
  if "parallel.shard_optimizer_state" in option or "parallel.shard_params" in option:
    assert r["memory"]["argument_bytes"] < 0.6 * plain["memory"]["argument_bytes"]


def test_max_batch_finds_the_largest_fitting_multiple(data_dir, monkeypatch):
  limit = 1000
  compiled = []

  def fake_report(config, name, devs=None):
    compiled.append(config.batch_size)
    return {"fits": config.batch_size <= limit, "global_batch": config.batch_size}

  monkeypatch.setattr(topology, "report", fake_report)
  config = runs.config_with({"dataset.data_dir": data_dir, "grad_accum_steps": 2})
  r = topology.max_batch(config, "v5e:2x2")
  assert r["batch_unit"] == 8 and r["max_batch"] == 1000 and r["global_batch"] == 1000  # 4 chips x accum 2.
  assert len(compiled) <= 2 * 8 + 2
  compiled.clear()
  r = topology.max_batch(runs.config_with({"dataset.data_dir": data_dir, "batch_size": 4096}), "v5e:2x2")
  assert r["max_batch"] == 1000 and len(compiled) <= 2 * 8 + 2  # Searched down from a batch that does not fit.
  limit = 3
  with pytest.raises(ConfigError, match=r"even the smallest global batch \(4\) does not fit"):
    topology.max_batch(runs.config_with({"dataset.data_dir": data_dir}), "v5e:2x2")


def test_max_batch_searches_with_shard_params(data_dir, monkeypatch, capsys):
  """One hidden layer of 2**24 units (1.2 B parameters): with shard_params a v5e:2x2 holds a quarter of the state
  and one gathered layer; plainly, not even 4 rows fit (parameters, gradient and Adam's two moments: 19.8 GB)."""
  trials, real = [], topology.report

  def recorded(config, name, devs=None):
    r = real(config, name, devs)
    trials.append((config.batch_size, config.parallel.shard_params, r["fits"]))
    return r

  monkeypatch.setattr(topology, "report", recorded)
  flags = ["--config.model.name=mlp", f"--config.model.hidden=({2**24},)", "--config.batch_size=256"]
  status = inspect.main(["inspect", "--config", runs.default.__file__, f"--config.dataset.data_dir={data_dir}", *flags,
                         "--config.parallel.shard_params=True", "--topology", "v5e:2x2", "--max_batch", "--json"])
  assert status == 0
  r = json.loads(capsys.readouterr().out)
  best, unit = r["max_batch"], r["batch_unit"]
  assert r["fits"] and r["options"]["shard_params"] and unit == 4 and best == r["global_batch"] >= unit
  assert all(shard for _, shard, _ in trials)  # Every trial compiled the sharded step.
  assert (best + unit, True, False) in trials  # One more step of the batch was compiled and did not fit.
  plain = real(runs.config_with({"dataset.data_dir": data_dir, "model.name": "mlp", "model.hidden": (2**24,),
                                 "batch_size": 4}), "v5e:2x2")
  assert plain["fits"] is False


@pytest.mark.parametrize("name", ["v9:2x2", "v5e", "v5litepod-16", "v5e:3x3"])
def test_unknown_topology_is_one_error_line(data_dir, name, capsys):
  status = inspect.main(["inspect", "--config", runs.default.__file__, f"--config.dataset.data_dir={data_dir}",
                         "--topology", name])
  err = capsys.readouterr().err.strip().splitlines()
  assert status == 2 and len(err) == 1 and err[0].startswith("error: ") and name in err[0]
  assert "GENERATION:AxB" in err[0] and "v5e:4x4" in err[0]


def test_gpu_names_fall_back_to_this_machines_report(data_dir, capsys):
  status = inspect.main(["inspect", "--config", runs.default.__file__, f"--config.dataset.data_dir={data_dir}",
                         "--config.model.name=mlp", "--topology", "h100:8"])
  out, err = capsys.readouterr()
  assert status == 0 and "needs" not in out and "8 x cpu" in out
  assert [line for line in err.splitlines() if "h100:8" in line][0].startswith("note: --topology h100:8: JAX compiles")


def test_flag_errors():
  with pytest.raises(ConfigError, match="--topology needs a name"):
    inspect.split_flags(["inspect", "--topology"])
  with pytest.raises(ConfigError, match="--topology needs a name"):
    inspect.split_flags(["inspect", "--topology", "--json"])
  with pytest.raises(ConfigError, match="--max_batch searches"):
    inspect.split_flags(["inspect", "--max_batch"])
  ours, rest = inspect.split_flags(["x", "--topology=v5e:2x2", "--max_batch", "--json", "--config.seed=1"])
  assert rest == ["x", "--config.seed=1"] and (ours.topology, ours.max_batch, ours.json) == ("v5e:2x2", True, True)


def test_libtpu_out_of_memory_messages_are_read():
  temps = "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (23.98G) " \
          "exceeds available HBM (15.75G)."
  assert topology._out_of_memory(temps, 100) == (100 + int(23.98 * 2**30), int(15.75 * 2**30))
  total = "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent error. Ran out of memory in " \
          "memory space hbm. Used 15.75G of 15.75G hbm. Exceeded hbm capacity by 3.98M.\n\nTotal hbm usage >= 16.00G:"
  assert topology._out_of_memory(total, 100) == (int(15.75 * 2**30) + int(3.98 * 2**20), int(15.75 * 2**30))
  assert topology._out_of_memory("RESOURCE_EXHAUSTED: something else", 100) is None


@pytest.mark.parametrize("kind, hbm_gib, margin_mib, tight", [
    ("TPU v6 lite", 32, 500, True), ("TPU v6 lite", 32, 700, False),  # 2% of 32 GiB = 655 MiB.
    ("TPU v5 lite", 16, 300, True), ("TPU v5", 95, 1500, True), ("TPU v4", 32, 4000, False)])
def test_tight_warning_quotes_the_chips_own_hbm(kind, hbm_gib, margin_mib, tight):
  hbm, margin = hbm_gib * 2**30, margin_mib * 2**20
  assert topology.CHIPS[kind].hbm_bytes == hbm
  mem = {"argument_bytes": hbm - margin, "temp_bytes": 0, "output_bytes": 0, "alias_bytes": 0}
  r = {"topology": "x", "num_devices": 4, "device_kind": kind, "global_batch": 64, "per_device_batch": 16,
       "per_device_bytes": hbm - margin, "memory": mem, "device_memory_bytes": hbm, "fits": True,
       "margin_bytes": margin, "flops_per_step": None, "collectives": {},
       "roofline": dict.fromkeys(("compute_s", "hbm_s", "collectives_s", "step_s", "xla_optimal_s"))}
  fit = next(line for line in topology.format_report(r).splitlines() if line.lstrip().startswith("fits"))
  assert ("tight" in fit) == tight, fit
  if tight:
    assert f"{hbm_gib:.1f} GiB HBM of a {kind}" in fit and (hbm_gib == 16 or "16 GiB" not in fit), fit
