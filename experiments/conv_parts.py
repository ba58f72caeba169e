"""The CNN's convolutions in parts, XLA:CPU against torch (oneDNN), one core and one thread each.

    python experiments/conv_parts.py [--rounds 7] [--repeats 5] [--out experiments/conv_parts.md]

ddp_compare.py's CNN spends most of its step in its two convolutions (3x3, 1 -> 32 then 32 -> 64 channels,
28x28, SAME; per-worker batch 128 at global batch 256). This times their parts as the train step runs them (the
first one needs no input gradient: its input is the data), in XLA (jitted: the forward, and `jax.vjp`'s input
and weight gradients) and in torch (`F.conv2d`, and `torch.nn.grad.conv2d_input` / `conv2d_weight`, which call
the same `convolution_backward` as autograd). One
child process per set of XLA flags (XLA reads them once), pinned to one core; in it every round times each part
in torch then in XLA, back to back. Prints per-part `median (min..max)` in ms over rounds and the per-round
ratios torch / XLA (> 1: XLA faster), as Markdown (`abrun.fmt`).
"""

import argparse
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402
import ddp_compare  # noqa: E402

BATCH, SIZE = 128, 28
CONVS = {"first": (1, 32), "second": (32, 64)}  # name -> (in, out) channels; the first needs no input gradient.
FLAG_SETS = {"XLA defaults": ddp_compare.XLA_ONE_THREAD,
             "ddp_compare's flags": f"{ddp_compare.XLA_ONE_THREAD} {ddp_compare.TUNED_XLA_FLAGS}"}


def _xla_parts() -> dict:
  """part -> a function of no arguments that runs it in XLA and waits."""
  import jax
  from jax import lax

  def conv(x: jax.Array, w: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

  forward = jax.jit(conv)
  d_input = jax.jit(lambda g, x, w: jax.vjp(lambda x: conv(x, w), x)[1](g)[0])
  d_weight = jax.jit(lambda g, x, w: jax.vjp(lambda w: conv(x, w), w)[1](g)[0])
  parts = {}
  for name, (ci, co) in CONVS.items():
    key = jax.random.PRNGKey(0)
    x, w, g = (jax.random.normal(key, s) for s in ((BATCH, SIZE, SIZE, ci), (3, 3, ci, co), (BATCH, SIZE, SIZE, co)))
    parts[name, "forward"] = lambda x=x, w=w: forward(x, w).block_until_ready()
    if name != "first":
      parts[name, "input gradient"] = lambda g=g, x=x, w=w: d_input(g, x, w).block_until_ready()
    parts[name, "weight gradient"] = lambda g=g, x=x, w=w: d_weight(g, x, w).block_until_ready()
  return parts


def _torch_parts() -> dict:
  """part -> a function of no arguments that runs it in torch (NCHW, one thread)."""
  import torch
  import torch.nn.functional as F
  torch.set_num_threads(1)
  parts = {}
  for name, (ci, co) in CONVS.items():
    x, w, g = torch.randn(BATCH, ci, SIZE, SIZE), torch.randn(co, ci, 3, 3), torch.randn(BATCH, co, SIZE, SIZE)

    def forward(x: torch.Tensor = x, w: torch.Tensor = w) -> None:
      with torch.no_grad():
        F.conv2d(x, w, padding=1)

    parts[name, "forward"] = forward
    if name != "first":
      parts[name, "input gradient"] = lambda x=x, w=w, g=g: torch.nn.grad.conv2d_input(x.shape, w, g, padding=1)
    parts[name, "weight gradient"] = lambda x=x, w=w, g=g: torch.nn.grad.conv2d_weight(x, w.shape, g, padding=1)
  return parts


def _timed(run, repeats: int) -> float:
  """Milliseconds per call of `run`, over `repeats` calls."""
  start = time.perf_counter()
  for _ in range(repeats):
    run()
  return (time.perf_counter() - start) / repeats * 1e3


def child(rounds: int, repeats: int) -> None:
  """In one process: every round, each part in torch then in XLA; prints `part torch_ms xla_ms` per round."""
  xla, torch = _xla_parts(), _torch_parts()
  for part in xla:  # Warm-up: compile, allocate.
    xla[part](), torch[part]()
  for _ in range(rounds):
    for part in xla:
      print(*(p.replace(" ", "_") for p in part), _timed(torch[part], repeats), _timed(xla[part], repeats), flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--out", default="")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    return child(args.rounds, args.repeats)
  pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
  lines = ["| XLA flags | convolution | part | torch ms | XLA ms | torch / XLA (> 1: XLA faster) |",
           "| --- | --- | --- | --- | --- | --- |"]
  for label, flags in FLAG_SETS.items():
    env = {**os.environ, **ddp_compare.ONE_THREAD, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(pin + [sys.executable, __file__, "--child", "--rounds", str(args.rounds), "--repeats",
                                str(args.repeats)], env=env, capture_output=True, text=True, check=True).stdout
    rows: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for line in out.splitlines():
      conv, part, t, x = line.split()
      rows.setdefault((conv, part.replace("_", " ")), []).append((float(t), float(x)))
    for (conv, part), times in rows.items():
      torch_ms, xla_ms = [t for t, _ in times], [x for _, x in times]
      lines.append(f"| {label} | {conv} | {part} | {abrun.fmt(torch_ms)} | {abrun.fmt(xla_ms)} | "
                   f"{abrun.fmt([t / x for t, x in times])} |")
  abrun.append(args.out, f"--rounds {args.rounds} --repeats {args.repeats}", "\n".join(lines))


if __name__ == "__main__":
  main()
