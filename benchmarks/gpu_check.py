"""Accelerator check: GPT-2-small tokens/s and MFU, ResNet-18 images/s at 224x224, with jaxdp's own step.

    python benchmarks/gpu_check.py [--size auto|gpu|tiny] [--steps 30] [--warmup 3] [--devices 1] \
        [--out benchmarks/gpu_check.json]

Records the device, then for each model builds jaxdp's mesh backend over `--devices` devices and its
train step (AdamW, bfloat16 compute, float32 parameters), places one synthetic batch on the devices,
runs `--warmup` steps (compilation included), then times `--steps` steps, each waited for, and reports
the median step time with its spread (min..max):
  gpt     GPT-2 small: 12 layers, 12 heads, width 768, context 1024, vocabulary 50257 (untied head),
          learned positions; tokens/s and MFU = FLOPs per step per device / step time / the device's
          dense bf16 peak (jaxdp.flops), with FLOPs from XLA's cost analysis and from the analytic
          6 N + 12 L T d per token (N = parameters outside the embeddings);
  resnet  ResNet-18 with the ImageNet stem on 224x224x3 images, 1000 classes; images/s.
`--size tiny` runs the same code at a toy size (CPU, seconds; a test runs it); `auto` picks `gpu` on a
GPU or TPU and `tiny` otherwise. Writes the results as JSON (default: benchmarks/gpu_check.json for
the full size, benchmarks/gpu_check_tiny.json for the tiny one). Sized to finish within 8 minutes on
one H100/H200-class GPU.
"""

import argparse
import datetime
import functools
import json
import os
import platform
import sys
import time
from typing import Any

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402

from jaxdp.report import flops  # noqa: E402
from jaxdp import models, optim, parallel, strategies  # noqa: E402
from jaxdp import step as step_lib  # noqa: E402
from jaxdp.configs import default  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "gpu": {
        "gpt": {"num_layers": 12, "num_heads": 12, "embed_dim": 768, "seq_len": 1024, "vocab": 50257, "batch": 16},
        "resnet": {"stage_sizes": (2, 2, 2, 2), "width": 64, "image": 224, "classes": 1000, "batch": 256},
    },
    "tiny": {
        "gpt": {"num_layers": 1, "num_heads": 2, "embed_dim": 32, "seq_len": 32, "vocab": 64, "batch": 2},
        "resnet": {"stage_sizes": (1,), "width": 8, "image": 32, "classes": 10, "batch": 2},
    },
}


def bench(model_fields: dict, input_shape: tuple[int, ...], num_classes: int, host: dict[str, np.ndarray],
          args: argparse.Namespace) -> dict[str, Any]:
  """Builds jaxdp's train step for the model, runs warm-up and timed steps; step times and FLOPs."""
  config = default.get_config()
  config.model.update(model_fields)
  config.optimizer, config.learning_rate, config.weight_decay = "adamw", 3e-4, 0.1
  model = models.get_model(config.model, input_shape, num_classes)
  tx = optim.make(config)
  strategy = strategies.DataParallel(strategies.StrategyOptions(compute_dtype=args.dtype))
  backend = parallel.make_backend("mesh", args.devices)
  init = functools.partial(step_lib.init_state, jax.random.PRNGKey(0), model=model, tx=tx, strategy=strategy)
  backend.bind_state(jax.eval_shape(init))
  state, batch = backend.init(init), backend.put_step(host)
  started = time.perf_counter()
  compiled = backend.map_train(functools.partial(step_lib.train_step, model=model, tx=tx, strategy=strategy)).lower(
      state, batch).compile()
  compile_s = time.perf_counter() - started
  box = [state, None]

  def call() -> Any:
    box[0], box[1] = compiled(box[0], batch)
    return box

  abrun.time_steps(call, args.warmup, jax.block_until_ready)
  times = abrun.time_steps(call, args.steps, jax.block_until_ready)
  params = jax.eval_shape(init).params
  return {"compile_seconds": compile_s, "step_seconds": abrun.spread(times), "steps": args.steps,
          "warmup": args.warmup, "num_params": int(sum(x.size for x in jax.tree.leaves(params))),
          "flops_per_step_per_device_xla": flops.compiled_flops(compiled),
          "final_loss": float(backend.get(box[1])["loss"]),
          "_params": params}


def run_gpt(size: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
  """GPT training steps on random tokens: tokens/s and MFU (XLA and analytic FLOPs)."""
  b, t, v = size["batch"] * args.devices, size["seq_len"], size["vocab"]
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, v, (b, t + 1)).astype(np.int32)
  fields = {"name": "gpt", "num_layers": size["num_layers"], "num_heads": size["num_heads"],
            "embed_dim": size["embed_dim"], "positions": "learned"}
  r = bench(fields, (t,), v, {"inputs": tokens[:, :-1], "labels": tokens[:, 1:]}, args)
  params = r.pop("_params")
  embeddings = params["embed"]["embedding"].size + params["pos"].size
  per_token = 6 * (r["num_params"] - embeddings) + 12 * size["num_layers"] * t * size["embed_dim"]
  step = r["step_seconds"]["median"]
  peak = flops.peak_flops(jax.devices()[0])
  r.update({"config": size, "global_batch": b, "tokens_per_step": b * t, "tokens_per_second": b * t / step,
            "flops_per_step_per_device_analytic": per_token * b * t / args.devices, "peak_flops_per_device": peak,
            "mfu_xla": flops.mfu(r["flops_per_step_per_device_xla"], step, peak),
            "mfu_analytic": flops.mfu(per_token * b * t / args.devices, step, peak)})
  return r


def run_resnet(size: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
  """ResNet training steps on random images: images/s."""
  b, hw = size["batch"] * args.devices, size["image"]
  rng = np.random.default_rng(0)
  host = {"inputs": rng.standard_normal((b, hw, hw, 3), dtype=np.float32),
          "labels": rng.integers(0, size["classes"], b).astype(np.int32)}
  fields = {"name": "resnet", "stage_sizes": size["stage_sizes"], "width": size["width"], "stem": "imagenet"}
  r = bench(fields, (hw, hw, 3), size["classes"], host, args)
  r.pop("_params")
  step = r["step_seconds"]["median"]
  peak = flops.peak_flops(jax.devices()[0])
  r.update({"config": size, "global_batch": b, "images_per_second": b / step, "peak_flops_per_device": peak,
            "mfu_xla": flops.mfu(r["flops_per_step_per_device_xla"], step, peak)})
  return r


def describe() -> dict[str, Any]:
  """The machine and the devices this run used."""
  dev = jax.devices()[0]
  return {"platform": dev.platform, "device_kind": dev.device_kind, "device_count": jax.device_count(),
          "jax": jax.__version__, "host": f"{abrun.cpu_model()} ({platform.machine()}), {os.cpu_count()} CPU cores",
          "load_average": abrun.load(), "xla_flags": os.environ.get("XLA_FLAGS", "")}


def _pct(x: float | None) -> str:
  return "n/a" if x is None else f"{100 * x:.1f}%"


def main(argv: list[str]) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--size", choices=("auto", "gpu", "tiny"), default="auto")
  p.add_argument("--steps", type=int, default=30, help="timed steps per model")
  p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
  p.add_argument("--devices", type=int, default=1, help="devices to use (the per-device batch stays the same)")
  p.add_argument("--dtype", default="bfloat16", help="compute dtype")
  p.add_argument("--models", default="gpt,resnet")
  p.add_argument("--out", default=None, help="JSON results (default: benchmarks/gpu_check[_tiny].json)")
  args = p.parse_args(argv)
  size = args.size if args.size != "auto" else ("tiny" if jax.devices()[0].platform == "cpu" else "gpu")
  out = args.out or os.path.join(HERE, "gpu_check.json" if size == "gpu" else "gpu_check_tiny.json")
  results: dict[str, Any] = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                             "command": abrun.command([sys.argv[0], *argv]), "size": size, "device": describe()}
  if size == "tiny":
    results["note"] = ("tiny size: checks that the script runs end to end; its throughputs say nothing about an "
                       "accelerator (run --size gpu on one)")
  print(f"device: {results['device']['device_count']} x {results['device']['device_kind']} "
        f"({results['device']['platform']}), using {args.devices}; size {size}", flush=True)
  runners = {"gpt": run_gpt, "resnet": run_resnet}
  for name in args.models.split(","):
    results[name] = runners[name](SIZES[size][name], args)
    r = results[name]
    spread = r["step_seconds"]
    line = f"{name}: step {1e3 * spread['median']:.1f} ms ({1e3 * spread['min']:.1f}..{1e3 * spread['max']:.1f})"
    if name == "gpt":
      line += (f", {r['tokens_per_second']:,.0f} tokens/s, MFU {_pct(r['mfu_analytic'])} (6N+12LTd), "
               f"{_pct(r['mfu_xla'])} (XLA FLOPs)")
    else:
      line += f", {r['images_per_second']:,.1f} images/s, MFU {_pct(r['mfu_xla'])} (XLA FLOPs)"
    print(line + f"; compiled in {r['compile_seconds']:.0f} s", flush=True)
  if flops.peak_flops(jax.devices()[0]) is None:
    print("MFU n/a: jaxdp.flops knows no peak FLOP/s for this device")
  with open(out, "w") as f:
    json.dump(results, f, indent=2, default=str)
  print(f"wrote {out}")
  return results


if __name__ == "__main__":
  main(sys.argv[1:])
