"""The benchmarks' pieces and their fairness: A/B alternation, same models, same updates, the GPU check (tiny)."""

import functools
import json
import math
import os
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import optax
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
import abrun  # noqa: E402
import equivalence  # noqa: E402
import fsdp_mechanism  # noqa: E402
import gpu_check  # noqa: E402
import overhead  # noqa: E402
import same_training  # noqa: E402

from jaxdp import models  # noqa: E402
from jaxdp import step as step_lib  # noqa: E402
from jaxdp.tools import launch  # noqa: E402
from jaxdp.config import ConfigError  # noqa: E402


def test_alternate_runs_contenders_in_turn_and_takes_per_round_medians():
  calls = []

  def contender(name: str, seconds: float):
    def run(n: int) -> list[float]:
      calls.append((name, n))
      return [seconds] * (n - 1) + [100.0]  # One outlier per round: the median ignores it.
    return run

  medians = abrun.alternate({"a": contender("a", 2.0), "b": contender("b", 1.0)}, rounds=3, steps=5, warmup=2)
  assert calls == [("a", 2), ("b", 2)] + [("a", 5), ("b", 5)] * 3
  assert medians == {"a": [2.0] * 3, "b": [1.0] * 3}
  assert abrun.ratios(medians["a"], medians["b"]) == [2.0] * 3
  assert abrun.spread([3.0, 1.0, 2.0]) == {"median": 2.0, "q1": 1.5, "q3": 2.5, "min": 1.0, "max": 3.0}
  assert abrun.fmt([3.0, 1.0, 2.0]) == "2 (1..3)"
  assert abrun.fmt_iqr([1.0, 2.0, 3.0, 4.0, 100.0]) == "3 [2..4]"


def test_overhead_contenders_compute_the_same_update(monkeypatch):
  """The hand-written baseline trains exactly what jaxdp's step trains (a fair race).

  With SGD: Adam's normalized update would hide a gradient of the wrong scale.
  """
  monkeypatch.setitem(overhead.WORKLOADS, "tiny", ({"name": "cnn", "features": (4,), "dense": 8}, (4, 4, 1), 16))
  env = {**overhead.setup("tiny", 2), "tx": optax.sgd(0.5)}
  jaxdp_run, baseline = overhead.jaxdp_contender(env), overhead.baseline_contender(env)
  unguarded = overhead.jaxdp_contender(env, functools.partial(
      step_lib.train_step, strategy=overhead.Unguarded(env["options"])))
  for contender in [jaxdp_run, baseline, unguarded]:
    assert len(contender(3)) == 3
  expected = jax.device_get(jaxdp_run.state.params)
  for params in [baseline.state[0], unguarded.state.params]:
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), jax.device_get(params), expected)
  assert int(jaxdp_run.state.step) == 3


def test_equivalence_largest_difference():
  reference = ([1, 2, 3], [2.0, 1.0, 0.5])
  diff, rel, step = equivalence.largest_difference(([1, 2, 3], [2.0, 1.1, 0.45]), reference)
  assert (round(diff, 6), round(rel, 6), step) == (0.1, 0.1, 2)


@pytest.mark.parametrize("workload", ["mlp", "cnn"])
def test_four_way_models_have_the_same_parameters_in_both_frameworks(workload):
  torch = pytest.importorskip("torch", reason="the `bench` extra (torch) is not installed")
  import four_way_jax
  import four_way_torch
  config = four_way_jax.get_config(workload)
  shape = (28, 28, 1) if workload == "mlp" else (8, 8, 1)
  model = models.get_model(config.model, shape, 10)
  jax_shapes = sorted(math.prod(x.shape) for x in jax.tree.leaves(jax.eval_shape(model.init, jax.random.PRNGKey(0))[0]))
  net = four_way_torch.make_model(workload, config, shape, 10)
  assert jax_shapes == sorted(p.numel() for p in net.parameters())
  assert net(torch.zeros(2, *reversed(shape)) if workload == "cnn" else torch.zeros(2, *shape)).shape == (2, 10)


def test_the_four_way_config_file_takes_its_workload_from_the_environment(monkeypatch):
  """jaxdp's CLI loads four_way_jax.py as a plain config file: FOUR_WAY_WORKLOAD names the workload."""
  import four_way
  import four_way_jax
  monkeypatch.setenv(four_way_jax.WORKLOAD_VAR, "gpt")
  assert four_way_jax.get_config().to_dict() == four_way_jax.get_config("gpt").to_dict()
  assert four_way_jax.get_config("mlp").model.hidden == (1024, 1024)
  assert four_way.config_env("cnn") == {four_way_jax.WORKLOAD_VAR: "cnn"}
  monkeypatch.delenv(four_way_jax.WORKLOAD_VAR)
  with pytest.raises(ValueError, match="unknown workload ''"):
    four_way_jax.get_config()


def test_resnet_imagenet_stem_is_an_option_and_a_bad_stem_is_named():
  def build(**fields):
    config = ml_collections.ConfigDict({"name": "resnet", "stage_sizes": (1,), "width": 8, "bn_axis_name": None,
                                        **fields})
    model = models.get_model(config, (64, 64, 3), 5)
    params, state = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    x = jax.ShapeDtypeStruct((2, 64, 64, 3), np.float32)
    return params, jax.eval_shape(lambda p, s, x: model.apply(p, s, x, train=False)[0], params, state, x)

  params, logits = build(stem="imagenet")
  assert params["stem"]["kernel"].shape == (7, 7, 3, 8) and logits.shape == (2, 5)
  assert build()[0]["stem"]["kernel"].shape == (3, 3, 3, 8)  # The default (CIFAR) stem is unchanged.
  with pytest.raises(ConfigError, match="'vgg'"):
    build(stem="vgg")


def test_device_check_runs_gpu_check_with_defaults_then_the_guides_flags_then_the_overhead(tmp_path):
  root = os.path.join(os.path.dirname(__file__), os.pardir)
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(OUT=str(tmp_path), SIZE="tiny", ARGS="--steps 1 --warmup 1 --models gpt", PYTHON=sys.executable)
  done = subprocess.run(["bash", "benchmarks/device_check.sh"], cwd=root, env=env, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stdout + done.stderr
  defaults = json.loads((tmp_path / "gpu_check_defaults.json").read_text())
  guide = json.loads((tmp_path / "gpu_check_guide_flags.json").read_text())
  assert defaults["device"]["xla_flags"] == "" and "--xla_gpu_triton_gemm_any=true" in guide["device"]["xla_flags"]
  assert defaults["gpt"]["tokens_per_second"] > 0 and guide["gpt"]["tokens_per_second"] > 0
  assert "jax " in (tmp_path / "device.txt").read_text()
  overhead = (tmp_path / "overhead.md").read_text()
  assert "- devices: 1 x cpu (cpu); jax" in overhead  # The machine's own device, none simulated.
  assert len([line for line in overhead.splitlines() if line.startswith("| mlp")]) == 1
  fsdp = (tmp_path / "fsdp_step.md").read_text()
  assert "- devices: 1 x cpu (cpu); jax" in fsdp
  assert len([line for line in fsdp.splitlines() if line.startswith("| mlp")]) == 1


def test_gpu_check_runs_at_a_tiny_size_on_cpu(tmp_path):
  out = tmp_path / "gpu_check.json"
  results = gpu_check.main(["--size", "tiny", "--steps", "2", "--warmup", "1", "--out", str(out)])
  saved = json.loads(out.read_text())
  assert saved["size"] == "tiny" and saved["device"]["platform"] == "cpu" and "tiny" in saved["command"]
  gpt, net = saved["gpt"], saved["resnet"]
  assert gpt["tokens_per_second"] > 0 and net["images_per_second"] > 0
  assert math.isfinite(gpt["final_loss"]) and math.isfinite(net["final_loss"])
  # The analytic 6N + 12LTd count agrees with XLA's cost analysis to within a factor of 2.
  assert 0.5 < gpt["flops_per_step_per_device_analytic"] / gpt["flops_per_step_per_device_xla"] < 2
  assert gpt["mfu_xla"] is None  # No peak FLOP/s for CPUs.
  assert results["gpt"]["num_params"] == gpt["num_params"]


def test_log_lines_of_both_sides_are_read_the_same_way(tmp_path):
  """The four-way study's instrument: log-line arrival per step, the steady window, samples/s (both sides)."""
  jaxdp_lines = [(1.0, "[0]   compile   5.58 s for 6 programs"), (3.0, "[0] step  50/400  12% | loss 0.5372"),
                 (3.5, "[1] step  50/400  12% | loss 0.5"), (5.0, "[0] step 100/400  25% | loss 0.06"),
                 (7.0, "[0] step 150/400  38% | loss 0.02"), (8.0, "[0] step 150/400 eval | loss 0.07")]
  torch_lines = [(0.5, "Setting OMP_NUM_THREADS"), (1.5, '{"step": 1, "time": 10.0, "loss": 2.3}'),
                 (3.0, '{"step": 50, "time": 11.0, "loss": 0.2}'), (4.0, '{"step": 100, "time": 13.0, "loss": 0.1}'),
                 (6.0, '{"step": 150, "time": 15.0, "loss": 0.1}'), (6.5, '{"step": 150, "eval/accuracy": 0.98}')]
  stamps = abrun.log_steps("jaxdp", jaxdp_lines)
  assert stamps == {50: 3.0, 100: 5.0, 150: 7.0}  # Process 0's train lines only.
  assert abrun.log_steps("torch", torch_lines) == {1: 1.5, 50: 3.0, 100: 4.0, 150: 6.0}
  assert abrun.window(stamps, warmup=60) == (100, 150)
  assert abrun.rate(stamps, 50, 150, 128) == 128 * 100 / 4.0
  with pytest.raises(ValueError, match="no log step after warm-up"):
    abrun.window(stamps, warmup=150)
  assert abrun.self_reported("torch", torch_lines, "", 50, 150, 128) == 128 * 100 / 4.0
  # jaxdp's own clock: perf/step_time of each log step weighted by the steps since the previous one.
  records = [{"step": 50, "perf/step_time": 9.0}, {"step": 120, "perf/step_time": 0.02},
             {"step": 120, "eval/accuracy": 0.9}, {"step": 150, "perf/step_time": 0.06, "time/total/input": 0.3}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  assert abrun.self_reported("jaxdp", [], str(tmp_path), 50, 150, 128) == pytest.approx(128 * 100 / 3.2)


def test_torch_side_trains_jaxdp_default_data_and_model(data_dir, capsys, monkeypatch, tmp_path):
  """The torch side of the four-way study's cnn: jaxdp's digits split and scaling, its default CNN, full batches."""
  torch = pytest.importorskip("torch", reason="the `bench` extra (torch) is not installed")
  import four_way
  import four_way_torch
  from jaxdp import data
  from jaxdp.configs import default
  data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": data_dir}))  # Registers and prepares it.
  tfds = pytest.importorskip("tensorflow_datasets")
  splits = four_way_torch.digits()
  for split, (x, y) in splits.items():  # The same examples (TFDS stores them in its own order), scaled to [0, 1].
    source = tfds.builder("digits", data_dir=data_dir).as_data_source(split)
    examples = [source[i] for i in range(len(source))]
    assert x.shape == (len(examples), 1, 8, 8) and x.dtype == torch.float32
    images = np.round(x.numpy() * 255).astype(np.uint8)
    ours = sorted(zip(y.tolist(), (image.tobytes() for image in images)))
    theirs = sorted((e["label"], e["image"].transpose(2, 0, 1).tobytes()) for e in examples)
    assert ours == theirs
    np.testing.assert_allclose(x.numpy() * 255, np.round(x.numpy() * 255), atol=1e-4)  # uint8 / 255, no more.
  # The same function: jaxdp's default CNN's parameters loaded into the torch CNN give the same logits.
  config = default.get_config()
  model = models.get_model(config.model, (8, 8, 1), 10)
  params, model_state = model.init(jax.random.PRNGKey(0))
  p = jax.tree.map(np.asarray, params)
  dense = p["dense"]["kernel"].reshape(4, 4, 64, 128).transpose(2, 0, 1, 3).reshape(1024, 128)  # NHWC -> NCHW rows.
  weights = [p["convs"][0]["kernel"].transpose(3, 2, 0, 1), p["convs"][0]["bias"],
             p["convs"][1]["kernel"].transpose(3, 2, 0, 1), p["convs"][1]["bias"],
             dense.T, p["dense"]["bias"], p["head"]["kernel"].T, p["head"]["bias"]]
  net = four_way_torch.cnn()
  assert [tuple(w.shape) for w in weights] == [tuple(t.shape) for t in net.parameters()]
  with torch.no_grad():
    for t, w in zip(net.parameters(), weights):
      t.copy_(torch.tensor(np.array(w)))
  x = np.random.default_rng(0).random((4, 8, 8, 1), dtype=np.float32)
  expected, _ = model.apply(params, model_state, x, train=False)
  np.testing.assert_allclose(net(torch.from_numpy(x.transpose(0, 3, 1, 2))).detach().numpy(), expected, rtol=1e-4,
                             atol=1e-5)
  # Each rank's loader gives full batches of global / world rows, config.batch_size's steps per epoch.
  rows = []
  for rank in range(2):
    sampler, loader = four_way_torch.batches(torch.utils.data.TensorDataset(*splits["train"]), config.batch_size, rank, 2, 0)
    sizes = [len(y) for _, y in loader]
    assert sizes == [config.batch_size // 2] * (len(splits["train"][1]) // config.batch_size)
    rows.append(list(sampler)[:sum(sizes)])
  assert len(set(rows[0]) | set(rows[1])) == sum(map(len, rows))  # The ranks read different examples.
  monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
  monkeypatch.setenv("MASTER_PORT", str(launch.free_port()))
  monkeypatch.setenv("RANK", "0")
  monkeypatch.setenv("WORLD_SIZE", "1")
  four_way.digits(str(tmp_path / "cnn.npz"))  # The arrays the study gives the torch side.
  assert four_way_torch.main(["--workload", "cnn", "--data", str(tmp_path / "cnn.npz"), "--steps", "30",
                              "--log_every", "15"]) == 0
  records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert [r["step"] for r in records] == [1, 15, 30, 30]
  assert records[-1]["eval/accuracy"] > 0.5 and records[2]["loss"] < records[0]["loss"] / 2  # It learns.


def test_four_way_driver_runs_its_sides_in_turn_and_reports_each_cell(tmp_path):
  """benchmarks/four_way.py end to end at a toy size: the plain-JAX and torch sides of the MLP, one process."""
  pytest.importorskip("torch", reason="the `bench` extra (torch) is not installed")
  import four_way
  out = tmp_path / "four_way.md"
  record = four_way.main(["--workloads", "mlp", "--procs", "1", "--sides", "jax,torch", "--rounds", "1",
                          "--steps", "6", "--warmup", "2", "--log_every", "2", "--examples", "2048", "--commit", "",
                          "--out", str(out)])
  runs = record["runs"]
  assert [(r["side"], r["round"]) for r in runs] == [("jax", 0), ("torch", 0)]
  for r in runs:
    assert r["window"] == [2, 6] and r["global_batch"] == 1024 and r["samples_per_s"] > 0
    assert math.isfinite(r["eval/loss"]) and 0 <= r["eval/accuracy"] <= 1
  saved = json.loads((tmp_path / "four_way.json").read_text())
  assert saved["runs"] == json.loads(json.dumps(runs))
  text = out.read_text()
  assert "## mlp, 1 process" in text and "jax/torch" in text and "four_way_jax.py --workload mlp" in text
  assert four_way.per_workload("mlp=5,9", 0) == {"mlp": 9, "cnn": 9, "resnet": 9, "gpt": 9}
  assert [abrun.in_turn(["a", "b", "c"], r) for r in (0, 1, 2, 3)] == [list("abc"), list("bca"), list("cab"),
                                                                         list("abc")]
  assert four_way.per_workload("gpt=7", 0)["gpt"] == 7 and four_way.per_workload("gpt=7", 0)["mlp"] == 300


def test_four_way_variants_run_jaxdp_with_their_flags_and_report_against_jaxdp():
  """--jaxdp_variant NAME=FLAGS: one more jaxdp side, its flags on the command line, its ratio to jaxdp per round;
  a run of jaxdp sides only has no acceptance table; a bad variant is an argparse error naming it."""
  import four_way
  args = four_way.parse(["--workloads", "mlp", "--procs", "2", "--sides", "jaxdp",
                         "--jaxdp_variant", "one=--config.cpu_devices=1 --config.seed=3"])
  assert args.sides == ["jaxdp", "jaxdp_one"]
  flags = args.variants["jaxdp_one"]
  assert flags == ("--config.cpu_devices=1", "--config.seed=3")
  cmd = four_way.command("jaxdp_one", "mlp", 2, 10, 2, "x.npz", ["--data"], "/w", None, flags)
  assert cmd[cmd.index("--") + 1:][-3:] == ["--data", *flags] and "jaxdp.launch" in cmd
  assert not set(flags) & set(four_way.command("jaxdp", "mlp", 2, 10, 2, "x.npz", ["--data"], "/w"))
  run = lambda side, rate: {"side": side, "workload": "mlp", "procs": 2, "samples_per_s": rate}  # noqa: E731
  table = four_way.cells([run("jaxdp", 100.0), run("jaxdp_one", 80.0)])
  assert four_way.ratio(table[("mlp", 2)], "jaxdp_one", "jaxdp") == [0.8]
  assert four_way.acceptance(table) == []
  table = four_way.cells([run("jaxdp", 100.0), run("torch", 50.0)])
  assert "| MLP, 2 processes: jaxdp CLI / torchrun DDP samples/s | 2 (2..2) | >= 1.0 |" in four_way.acceptance(table)
  with pytest.raises(SystemExit):
    four_way.parse(["--jaxdp_variant", "no flags"])


def test_fsdp_mechanisms_compile_the_same_training_step_over_the_same_layout():
  s = fsdp_mechanism.Setup("mlp4x512:64", jax.devices())
  built = fsdp_mechanism.build(s)
  agree = fsdp_mechanism.one_step_agreement(s, built)
  # Under jit the compiler picks its own collectives and summation order (float rounding); the others are bitwise.
  assert set(agree) == {"ddp", "shard_map", "jit", "jit+act"}, agree
  assert agree["ddp"] == agree["jit+act"] == 0.0 and agree["jit"] <= same_training.REL_L2, agree
  figures = {name: fsdp_mechanism.compiled_figures(c, 8) for name, c in built.items()}
  args = {name: f["memory"]["argument_bytes"] for name, f in figures.items()}
  # One FSDP layout, sharded; jaxdp's step also takes its block's index (an int32).
  assert args["jit"] == args["jit+act"] == args["shard_map"] - 4 < 0.3 * args["ddp"]
  assert figures["shard_map"]["collectives"]["reduce-scatter"]["count"] == 9  # Four kernels, five biases.
  assert "reduce-scatter" not in figures["ddp"]["collectives"]

