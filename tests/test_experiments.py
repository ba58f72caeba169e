"""The experiments' pieces and their fairness: A/B alternation, same models, same updates, the GPU check (tiny)."""

import functools
import json
import math
import os
import sys

import jax
import ml_collections
import numpy as np
import optax
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "experiments"))
import abrun  # noqa: E402
import ddp_common  # noqa: E402
import equivalence  # noqa: E402
import gpu_check  # noqa: E402
import overhead  # noqa: E402
import step_variants  # noqa: E402

from jaxdp import models  # noqa: E402
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
  """The hand-written baseline and the ablations train exactly what jaxdp's step trains (a fair race).

  With SGD: Adam's normalized update would hide a gradient of the wrong scale.
  """
  monkeypatch.setitem(overhead.WORKLOADS, "tiny", ({"name": "cnn", "features": (4,), "dense": 8}, (4, 4, 1), 16))
  env = {**overhead.setup("tiny", 2), "tx": optax.sgd(0.5)}
  jaxdp_run, baseline = overhead.jaxdp_contender(env), overhead.baseline_contender(env)
  ablations = [overhead.jaxdp_contender(env, functools.partial(step_variants.train_step, **kw))
               for kw in overhead.ABLATIONS.values()]
  for contender in [jaxdp_run, baseline, *ablations]:
    assert len(contender(3)) == 3
  expected = jax.device_get(jaxdp_run.state.params)
  for params in [baseline.state[0]] + [a.state.params for a in ablations]:
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), jax.device_get(params), expected)
  assert int(jaxdp_run.state.step) == 3


def test_equivalence_largest_difference():
  reference = ([1, 2, 3], [2.0, 1.0, 0.5])
  diff, rel, step = equivalence.largest_difference(([1, 2, 3], [2.0, 1.1, 0.45]), reference)
  assert (round(diff, 6), round(rel, 6), step) == (0.1, 0.1, 2)


def test_ddp_local_batches_tile_the_global_batch():
  whole = ddp_common.local_batch("mlp", 8, 0, 1)
  halves = [ddp_common.local_batch("mlp", 8, r, 2) for r in range(2)]
  np.testing.assert_array_equal(np.concatenate([h[0] for h in halves]), whole[0])
  np.testing.assert_array_equal(np.concatenate([h[1] for h in halves]), whole[1])
  assert whole[0].shape == (8, 28, 28, 1) and whole[0].dtype == np.float32


@pytest.mark.parametrize("name", sorted(ddp_common.MODELS))
def test_ddp_models_have_the_same_parameters_in_both_frameworks(name):
  torch = pytest.importorskip("torch", reason="the `bench` extra (torch) is not installed")
  import ddp_torch_worker
  spec = ddp_common.MODELS[name]
  config = {"name": name, **{k: v for k, v in spec.items() if k != "input_shape"}}
  model = models.get_model(ml_collections.ConfigDict(config), spec["input_shape"], ddp_common.NUM_CLASSES)
  jax_shapes = sorted(math.prod(x.shape) for x in jax.tree.leaves(jax.eval_shape(model.init, jax.random.PRNGKey(0))[0]))
  torch_shapes = sorted(p.numel() for p in ddp_torch_worker.make_model(name).parameters())
  assert jax_shapes == torch_shapes
  x = torch.zeros(2, *reversed(spec["input_shape"]))
  assert ddp_torch_worker.make_model(name)(x).shape == (2, ddp_common.NUM_CLASSES)


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
