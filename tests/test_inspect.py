"""jaxdp.inspect reads the compiled train step (8 fake CPU devices): what each optimizer step sends,
holds and donates, for plain data parallelism, accumulation, a bfloat16 all-reduce and ZeRO-1."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdp.tasks import Metric
from jaxdp.tools import hlo, inspect
from jaxdp.configs import default, mlp_digits

N = 8
METRIC_BYTES = 64  # The step's metric sums and weights (float32 scalars) travel with the gradients; a few more.


@pytest.fixture(scope="module")
def analyzed(data_dir):
  """`analyze` of a small MLP (64 hidden units, 4,810 parameters) with overrides, each compiled once per module."""
  cache = {}

  def run(**overrides):
    key = tuple(sorted(overrides.items()))
    if key not in cache:
      config = mlp_digits.get_config()
      config.dataset.data_dir = data_dir
      config.model.hidden = (64,)
      config.batch_size = 64
      config.update_from_flattened_dict({k.replace("__", "."): v for k, v in overrides.items()})
      cache[key] = inspect.analyze(config)
    return cache[key]

  return run


def _params(r):
  return r["params"]["bytes"]


@pytest.mark.parametrize("overrides", [{}, {"parallel__backend": "pmap"}])  # {}: the mesh backend.
def test_plain_data_parallelism_all_reduces_the_parameter_bytes_once(analyzed, overrides):
  r = analyzed(**overrides)
  assert r["run"]["devices"] == N and r["params"]["count"] == 64 * 64 + 64 + 64 * 10 + 10
  for program in ("compiled", "lowered"):
    ops = r["collectives"][program]
    grads = ops["all-reduce"]
    # Never twice the parameters; the scalars ride in their own operands or in the flat buffer (CPU).
    assert grads["tensor_bytes"] in (_params(r), grads["bytes"]), (program, grads)
    assert 0 < grads["bytes"] - _params(r) <= METRIC_BYTES
    assert set(grads["dtypes"]) == {"float32"}
    assert all(ops[k]["count"] == 0 for k in inspect.KINDS if k != "all-reduce"), ops
  assert 1 <= r["collectives"]["compiled"]["all-reduce"]["count"] <= 4  # XLA combines them into one or a few.
  assert r["collectives"]["compiled"]["all-reduce"]["in_loop"] == 0


def test_accumulation_still_all_reduces_once_per_step(analyzed):
  one, four = analyzed(), analyzed(grad_accum_steps=4)
  assert four["run"]["grad_accum_steps"] == 4 and four["while_loops"] >= 1  # The scan over micro-batches.
  grads, baseline = four["collectives"]["compiled"]["all-reduce"], one["collectives"]["compiled"]["all-reduce"]
  assert grads["in_loop"] == 0  # Not inside the scan: once per optimizer step.
  # The parameters once, the same operands; the metrics' sums and weights beside them (XLA merges the equal
  # weights of unweighted metrics outside the scan only).
  assert (grads["count"], grads["tensor_bytes"]) == (baseline["count"], baseline["tensor_bytes"]) == (
      baseline["count"], _params(one))
  assert 0 < grads["scalar_bytes"] <= METRIC_BYTES and 0 < baseline["scalar_bytes"] <= METRIC_BYTES
  assert any("counts a loop body once" in note for note in four["notes"])


def test_bfloat16_all_reduce_sends_half_the_parameter_bytes(analyzed):
  r = analyzed(parallel__allreduce_dtype="bfloat16")
  lowered, compiled = r["collectives"]["lowered"]["all-reduce"], r["collectives"]["compiled"]["all-reduce"]
  assert lowered["tensor_bytes"] == _params(r) // 2 == lowered["dtypes"]["bfloat16"]
  if "bfloat16" not in compiled["dtypes"]:  # XLA:CPU promotes it back to float32: the report must say so.
    assert compiled["tensor_bytes"] == _params(r)
    assert any("all-reduce" in n and "promotes bfloat16" in n for n in r["notes"]), r["notes"]
  else:
    assert compiled["tensor_bytes"] == _params(r) // 2


@pytest.mark.parametrize("devices", [N, 2])
def test_zero1_argument_bytes_are_params_plus_a_shard_of_adam(analyzed, devices):
  sharded = analyzed(parallel__shard_optimizer_state=True, parallel__num_devices=devices)
  plain = analyzed(parallel__num_devices=devices) if devices != N else analyzed()
  p = _params(plain)
  assert sharded["run"]["optimizer"] == "adam" and sharded["run"]["devices"] == devices
  # Argument bytes less the batch (subtracted exactly): parameters + Adam's two moments (sharded or not).
  for r, expected in ((sharded, p + 2 * p / devices), (plain, p + 2 * p)):
    state_bytes = r["memory"]["argument_bytes"] - r["per_device"]["batch_bytes"]
    assert abs(state_bytes - expected) <= 0.02 * expected, (state_bytes, expected)
  ops = sharded["collectives"]["compiled"]
  assert ops["all-reduce"]["tensor_bytes"] == 0  # Gradients are reduce-scattered, parameters all-gathered.
  for kind in ("reduce-scatter", "all-gather"):  # Each moves the parameters once (padded to N per leaf).
    assert p <= ops[kind]["tensor_bytes"] <= p + 4 * devices * 4, (kind, ops[kind])


@pytest.mark.parametrize("overrides", [{}, {"parallel__backend": "pmap"}, {"parallel__shard_optimizer_state": True}])
def test_donation_aliases_parameters_and_optimizer_state(analyzed, overrides):
  r = analyzed(**overrides)
  held = r["per_device"]["params_bytes"] + r["per_device"]["opt_state_bytes"]
  assert r["memory"]["alias_bytes"] >= held > 0


def test_parser_finds_collectives_in_loop_bodies_and_full_buffers():
  text = """HloModule m, num_partitions=8

%body (p: (s32[], f32[16])) -> (s32[], f32[16]) {
  %ar = f32[16]{0} all-reduce(%x), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
}

ENTRY %main (a: f32[16]) -> f32[16] {
  %w = (s32[], f32[16]{0}) while(%t), condition=%cond, body=%body
  %rs = f32[2]{0} reduce-scatter(%a), channel_id=2, replica_groups=[1,8]<=[8], dimensions={0}, to_apply=%add
  %ag = ((bf16[2]{0}), bf16[16]{0}) all-gather-start(%rs), channel_id=3, replica_groups={}, dimensions={0}
  %both = (f32[16]{0}, f32[]) all-reduce(%a, %s), channel_id=4, replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
}
"""
  ops, loops = hlo.parse_compiled(text, 8)
  counted = hlo.tally(ops)
  assert loops == 1
  assert counted["all-reduce"] == {"count": 2, "bytes": 132, "tensor_bytes": 128, "scalar_bytes": 4, "in_loop": 1,
                                   "dtypes": {"float32": 132}}
  assert (counted["reduce-scatter"]["bytes"], counted["reduce-scatter"]["in_loop"]) == (64, 0)
  assert counted["all-gather"]["bytes"] == 32 and counted["all-gather"]["dtypes"] == {"bfloat16": 32}


def test_cli_prints_table_and_json(data_dir, capsys):
  argv = ["jaxdp.inspect", "--config", mlp_digits.__file__, f"--config.dataset.data_dir={data_dir}",
          "--config.model.hidden=(16,)", "--config.batch_size=32"]
  assert inspect.main(argv + ["--json"]) == 0
  report = json.loads(capsys.readouterr().out)
  assert report["params"]["count"] == 64 * 16 + 16 + 16 * 10 + 10
  assert report["collectives"]["compiled"]["all-reduce"]["tensor_bytes"] == report["params"]["bytes"]
  assert report["memory"]["alias_bytes"] > 0 and report["flops_per_step"] > 0
  text = inspect.format_report(report)
  for line in ("parameters  1,210 (4.7 KiB)", "compiled all-reduce", "lowered all-reduce", "alias", "FLOPs/step"):
    assert line in text, text


@pytest.mark.parametrize("override, named", [
    ("--config.batch_size=30", "30"),
    ("--config.parallel.backend=pmap --config.parallel.shard_optimizer_state=True", "pmap"),
    ("--config.nokey=1", "config.nokey"),
])
def test_cli_config_mistakes_give_one_error_line(data_dir, capsys, override, named):
  argv = ["jaxdp.inspect", "--config", mlp_digits.__file__, f"--config.dataset.data_dir={data_dir}",
          *override.split()]
  assert inspect.main(argv) == 2
  captured = capsys.readouterr()
  err = captured.err.strip()
  assert err.startswith("error: ") and len(err.splitlines()) == 1 and named in err, err
  assert captured.out == ""


def test_cli_process_simulates_cpu_devices_and_prints_json(data_dir):
  proc = subprocess.run([sys.executable, "-m", "jaxdp.inspect", "--config", mlp_digits.__file__, "--cpu_devices", "2",
                         f"--config.dataset.data_dir={data_dir}", "--config.model.hidden=(8,)", "--json"],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert json.loads(proc.stdout)["run"]["devices"] == 2


class _Features:
  """A dataset's features as `Dataset.element_spec` states them: two inputs, a float target, a text field."""

  def element_spec(self):
    return {"image": jax.ShapeDtypeStruct((8, 8, 3), np.float32), "mask": jax.ShapeDtypeStruct((8, 8), np.bool_),
            "target": jax.ShapeDtypeStruct((2,), np.float32), "ids": jax.ShapeDtypeStruct((5,), np.int32),
            "meta/name": jax.ShapeDtypeStruct((), np.dtype(object))}


def test_fake_batches_hold_every_numeric_feature_of_the_dataset_not_inputs_and_labels():
  shapes = hlo.batch_shapes(_Features(), 6)
  assert {k: (x.shape, np.dtype(x.dtype)) for k, x in shapes.items()} == {  # Text never reaches a device.
      "image": ((6, 8, 8, 3), np.float32), "mask": ((6, 8, 8), np.bool_), "target": ((6, 2), np.float32),
      "ids": ((6, 5), np.int32)}
  batch = hlo.fake_batch(shapes)
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {k: (x.shape, np.dtype(x.dtype)) for k, x in shapes.items()}
  assert set(np.unique(batch["ids"])) == {0, 1} and batch["mask"].any() and not batch["mask"].all()
  assert batch["image"].std() > 0.5 and np.isfinite(batch["target"]).all()
  assert all(np.array_equal(batch[k], v) for k, v in hlo.fake_batch(shapes).items())  # The same draw each time.


class Masked(nnx.Module):
  """A model of two inputs, an image and its mask (named `test_inspect:Masked`)."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.image, self.mask, self.head = nnx.Linear(192, 4, rngs=rngs), nnx.Linear(64, 4, rngs=rngs), nnx.Linear(4, 2, rngs=rngs)

  def __call__(self, image, mask):
    return self.head(nnx.relu(self.image(image.reshape(len(image), -1)) + self.mask(mask.reshape(len(mask), -1))))


def masked(model, batch):
  """Squared error of the two-input model against the float target, weighted by meta/weight."""
  image = batch["image"].astype(jnp.float32) / 255
  error = jnp.square(model(image, batch["mask"].astype(jnp.float32)) - batch["target"])
  return error, {"weighted": Metric(error, weights=batch["meta/weight"][:, None])}


def test_inspect_compiles_a_task_on_the_dataset_s_own_features(tmp_path):
  config = default.get_config()
  config.dataset.name, config.dataset.data_dir = "feature_datasets:Scenes", str(tmp_path)
  config.model.name, config.task.name = "test_inspect:Masked", "test_inspect:masked"
  config.batch_size, config.best_metric, config.best_mode = 16, "eval/loss", "min"
  r = inspect.analyze(config)
  # Per device 2 rows of image u8[8, 8, 3] (not supervised "inputs": not made float), mask bool[8, 8], target
  # f32[2], meta/id i32, meta/weight f32; its text feature never reaches the step.
  assert r["per_device"]["batch_bytes"] == 2 * (8 * 8 * 3 + 8 * 8 + 2 * 4 + 4 + 4)
  assert r["params"]["count"] == 192 * 4 + 4 + 64 * 4 + 4 + 4 * 2 + 2
