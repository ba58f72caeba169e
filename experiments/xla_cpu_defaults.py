"""XLA:CPU flag sets against XLA's defaults, per machine: what a user might set in XLA_FLAGS (jaxdp sets none).

    python experiments/xla_cpu_defaults.py [--rounds 7] [--modes 1proc_interleaved,2proc_interleaved,1proc,2proc]
        [--sets defaults,ynn_off,...] [--workloads matmul,mlp1024,...] [--out experiments/xla_cpu_defaults.md]

Workloads: a jitted 512x1024 @ 1024x1024 matmul, and jitted train steps (grad + Adam) of jaxdp's models on
synthetic batches (MLP 784-1024-1024-10 at batch 1024 and 512, the digits CNN at 128 and 16, the small GPT at
batch 12 x 64 tokens, ResNet-18 at 32x32, batch 8). Modes, each in fresh processes:
- `1proc`, `2proc`: a new process per (flag set, round), the set in XLA_FLAGS (read once, when the CPU client
  starts); sets run A B C A B C ...; a persistent compilation cache (keyed by XLA_FLAGS) spares later rounds
  the compile. On a shared machine a load that changes between processes lands on one set only.
- `1proc_interleaved`, `2proc_interleaved`: one process compiles each workload once per set (the same flags as
  per-executable compiler options; the compiled HLO is the same, e.g. no YNNPACK fusion with ynn_off), then
  alternates the sets' steps, A B C A B C ..., each round about ROUND_SECONDS per set: every set sees the same
  load. The ratios are per round, set / defaults in the same round (< 1: faster than XLA's defaults).
`2proc*`: two such processes at once, each with one device and unpinned, as `jaxdp.launch --num_processes 2`
starts them (each its own steps, no all-reduce: the flags change the compute).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import abrun  # noqa: E402

YNN = "--xla_cpu_experimental_ynn_fusion_type"
SETS = {
    "defaults": "",
    "ynn_off": f"{YNN}=",
    # XLA's default list is individual_dot,individual_convolution,reduce (the compiled HLO's __ynn_fusion ops say
    # so: the GPT's reduce_sums are among them; its help text says "empty"). Each set names its list in full, the
    # form compiler options take too (they reject the +/- form).
    "ynn_noconv": f"{YNN}=individual_dot,reduce",  # = -individual_convolution: XLA's convolutions.
    "ynn_noreduce": f"{YNN}=individual_dot,individual_convolution",  # = -reduce: XLA's reductions.
    "ynn_dot": f"{YNN}=individual_dot",  # YNNPACK's dots alone (the runs before 2026-12-04 called it ynn_noconv).
    "ynn_nodot": f"{YNN}=individual_convolution,reduce",  # = -individual_dot: XLA's dots.
    "eigen1": "--xla_cpu_multi_thread_eigen=false",
    "ynn_off_eigen1": f"{YNN}= --xla_cpu_multi_thread_eigen=false",
    "concurrency_off": "--xla_cpu_enable_concurrency_optimized_scheduler=false",
  # oneDNN's matmuls for every dot (its pass runs before YNNPACK's, so YNNPACK keeps the convolutions): YNNPACK
  # takes no dot whose lhs contracts its dimension 0 (the weight gradients X^T dY), which XLA's Eigen dots run
  # at half the speed (experiments/dense_parts.md).
  "onednn": "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_fusion_type=individual_dot",
  "onednn_dot": "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_fusion_type=dot",  # Elementwise fused in.
}
WORKLOADS = ("matmul", "mlp1024", "mlp512", "cnn128", "cnn16", "gpt", "resnet18")
STEP_SECONDS = 1.0  # Timed seconds per workload per process (at least MIN_STEPS steps).
ROUND_SECONDS = 0.25  # Interleaved: about this long per flag set per round (at least MIN_STEPS steps).
MIN_STEPS, WARMUP = 3, 2


def _train_step(model_name: str, kwargs: dict, input_shape: tuple[int, ...], classes: int, batch: int,
                tokens: bool = False, options: dict | None = None) -> Callable[[], object]:
  """A jitted grad + Adam step of a jaxdp model on one synthetic batch, compiled with XLA debug `options` on top
  of XLA_FLAGS; returns a call that runs one step."""
  import jax
  import ml_collections
  import numpy as np
  import optax
  from jaxdp import models
  model = models.get_model(ml_collections.ConfigDict({"name": model_name, **kwargs}), input_shape, classes)
  params, model_state = model.init(jax.random.PRNGKey(0))
  tx = optax.adam(1e-3)
  rng = np.random.default_rng(0)
  if tokens:
    x = rng.integers(0, classes, (batch, *input_shape), dtype=np.int32)
    y = np.roll(x, -1, axis=1)
  else:
    x = rng.random((batch, *input_shape), dtype=np.float32)
    y = np.arange(batch) % classes

  def step(params, model_state, opt_state, x, y):
    def loss(p):
      logits, new_state = model.apply(p, model_state, x, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), new_state
    (value, model_state), grads = jax.value_and_grad(loss, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), model_state, opt_state, value

  state = [params, model_state, tx.init(params)]
  x, y = jax.device_put(x), jax.device_put(y)
  step = jax.jit(step).lower(*state, x, y).compile(compiler_options=options or {})

  def run() -> None:
    state[0], state[1], state[2], value = step(*state, x, y)
    value.block_until_ready()
  return run


def _matmul(options: dict | None = None) -> Callable[[], object]:
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.PRNGKey(0), (512, 1024))
  b = jax.random.normal(jax.random.PRNGKey(1), (1024, 1024))
  f = jax.jit(jnp.matmul).lower(a, b).compile(compiler_options=options or {})
  return lambda: f(a, b).block_until_ready()


def options_of(flags: str) -> dict[str, object]:
  """XLA_FLAGS text -> per-executable compiler options (`--xla_x=false` -> {"xla_x": False})."""
  out: dict[str, object] = {}
  for flag in flags.split():
    name, _, value = flag[2:].partition("=")
    if name.endswith("_fusion_type") and value:  # Compiler options take the enum's full names, comma-separated.
      if value[0] in "+-":
        raise ValueError(f"{flag}: the +/- form does not run as a compiler option; name the whole list")
      value = ",".join(f"LIBRARY_FUSION_TYPE_{v.upper()}" for v in value.split(","))
    out[name] = {"true": True, "false": False}.get(value, value)
  return out


def build(name: str, options: dict | None = None) -> Callable[[], object]:
  """The workload `name` (compiled with `options`) as a call that runs (and waits for) one step."""
  mlp = ("mlp", {"hidden": (1024, 1024)}, (784,), 10)
  cnn = ("cnn", {}, (8, 8, 1), 10)
  gpt = ("gpt", {"num_layers": 4, "num_heads": 4, "embed_dim": 128, "mlp_ratio": 4, "positions": "rotary"}, (64,), 256)
  resnet = ("resnet", {"stage_sizes": (2, 2, 2, 2), "width": 64, "bn_axis_name": None}, (32, 32, 3), 10)
  table = {"matmul": lambda: _matmul(options),
           "mlp1024": lambda: _train_step(*mlp, 1024, options=options),
           "mlp512": lambda: _train_step(*mlp, 512, options=options),
           "cnn128": lambda: _train_step(*cnn, 128, options=options),
           "cnn16": lambda: _train_step(*cnn, 16, options=options),
           "gpt": lambda: _train_step(*gpt, 12, tokens=True, options=options),
           "resnet18": lambda: _train_step(*resnet, 8, options=options)}
  return table[name]()


def interleaved_worker(workloads: list[str], sets: list[str], rounds: int) -> None:
  """In this one process, each workload compiled once per flag set (compiler options), then the sets' steps
  alternated A B C A B C ... for `rounds` rounds: a load that changes over seconds hits every set alike.
  One JSON line: per workload and set, each round's median step seconds."""
  out = {}
  for name in workloads:
    runs = {s: build(name, options_of(SETS[s])) for s in sets}
    for run in runs.values():
      for _ in range(WARMUP):
        run()
    t = time.perf_counter()
    runs[sets[0]]()
    steps = max(MIN_STEPS, int(ROUND_SECONDS / (time.perf_counter() - t)))
    out[name] = {s: [] for s in sets}
    for _ in range(rounds):
      for s, run in runs.items():
        out[name][s].append(statistics.median(abrun.time_steps(run, steps, lambda r: r)))
    del runs
  print("RESULT " + json.dumps({"medians": out}), flush=True)


def worker(workloads: list[str]) -> None:
  """Times each workload in this process (XLA_FLAGS from the environment); one JSON line of step seconds."""
  import jax
  out, ready_s = {}, {}
  for name in workloads:
    start = time.perf_counter()
    run = build(name)
    for _ in range(WARMUP):
      run()
    ready_s[name] = time.perf_counter() - start
    times, start = [], time.perf_counter()
    while len(times) < MIN_STEPS or time.perf_counter() - start < STEP_SECONDS:
      t = time.perf_counter()
      run()
      times.append(time.perf_counter() - t)
    out[name] = times
  print("RESULT " + json.dumps({"devices": jax.device_count(), "times": out, "ready_s": ready_s}), flush=True)


def run_set(flags: str, mode: str, workloads: list[str], cache_dir: str) -> list[dict]:
  """Runs the worker with `flags` as XLA_FLAGS: once (1proc) or twice at once (2proc); each process's result."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update({"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": cache_dir,
              "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"})
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", ",".join(workloads)]
  return _results([subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for _ in range(2 if mode == "2proc" else 1)], f"XLA_FLAGS={flags!r}")


def machine() -> str:
  """`lscpu`'s model name and the ISA flags that matter here."""
  flags = set()
  with open("/proc/cpuinfo") as f:
    for line in f:
      if line.startswith("flags"):
        flags = set(line.split(":", 1)[1].split())
        break
  isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile") if f in flags]
  return f"{abrun.cpu_model()} ({platform.machine()}), {os.cpu_count()} cores, ISA flags: {' '.join(isa) or 'none'}"


def interleaved(mode: str, sets: list[str], workloads: list[str], rounds: int, cores: int = 0) -> list[dict]:
  """Runs `interleaved_worker` in one fresh process (1proc_interleaved) or two at once (2proc_interleaved), each
  on its last `cores` cores (0: unpinned)."""
  env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "JAX_PLATFORMS": "cpu"}
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", ",".join(workloads), "--interleave", ",".join(sets),
         "--rounds", str(rounds), "--cores", str(cores)]
  return _results([subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for _ in range(2 if mode.startswith("2proc") else 1)], "interleaved")


def _results(procs: list[subprocess.Popen], what: str) -> list[dict]:
  results = []
  for p in procs:
    stdout, stderr = p.communicate()
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if p.returncode or not lines:
      raise RuntimeError(f"worker ({what}) failed ({p.returncode}):\n{stderr[-3000:]}")
    results.append(json.loads(lines[-1][len("RESULT "):]))
  return results


def table(mode: str, sets: list[str], workloads: list[str], medians: dict[str, dict[str, list[float]]],
          loads: list[float]) -> list[str]:
  """Markdown: per set and workload, the median [min..max] ms and the per-round ratio to the defaults."""
  how = ("one process, the sets' steps alternated within it (compiler options)" if "interleaved" in mode
         else "a fresh process per set and round (XLA_FLAGS)")
  lines = [f"### {mode}: {how}", "",
           f"ms per step, median over rounds{' and both processes' * mode.startswith('2proc')} [min..max]; "
           f"then / defaults: per-round ratio, median (min..max), < 1 faster. Load {min(loads):.1f}..{max(loads):.1f}.",
           "", "| flag set | XLA_FLAGS | " + " | ".join(workloads) + " |",
           "| --- | --- | " + " | ".join("---" for _ in workloads) + " |"]
  for s in sets:
    cells = []
    for w in workloads:
      ms = [1e3 * v for v in medians[s][w]]
      cell = f"{statistics.median(ms):.2f} [{min(ms):.2f}..{max(ms):.2f}]"
      if s != "defaults":
        cell += f"; **{abrun.fmt(abrun.ratios(medians[s][w], medians['defaults'][w]))}**"
      cells.append(cell)
    lines.append(f"| {s} | `{SETS[s] or '(none)'}` | " + " | ".join(cells) + " |")
  return lines + [""]


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
  parser.add_argument("--interleave", default="", help=argparse.SUPPRESS)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--modes", default="1proc_interleaved,2proc_interleaved",
                      help="1proc_interleaved, 2proc_interleaved, 1proc, 2proc")
  parser.add_argument("--sets", default="defaults,ynn_off,ynn_noconv,ynn_nodot,eigen1,concurrency_off")
  parser.add_argument("--workloads", default=",".join(WORKLOADS))
  parser.add_argument("--out", default="")
  parser.add_argument("--cores", type=int, default=0,
                      help="1proc_interleaved: pin the process to this many cores, so XLA's pool has as many threads "
                           "(1: each one of 2 jaxdp.launch processes on 2 cores); 0, and 2proc modes: unpinned.")
  args = parser.parse_args(argv)
  if args.worker and args.cores and hasattr(os, "sched_setaffinity"):  # Before JAX sizes its thread pool.
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[-args.cores:])
  if args.worker and args.interleave:
    interleaved_worker(args.worker.split(","), args.interleave.split(","), args.rounds)
    return
  if args.worker:
    worker(args.worker.split(","))
    return
  workloads, sets = args.workloads.split(","), args.sets.split(",")
  load_before, started = abrun.load(), time.time()
  lines = []
  with tempfile.TemporaryDirectory(prefix="xla-cpu-defaults-") as cache_dir:
    for mode in args.modes.split(","):
      medians: dict[str, dict[str, list[float]]] = {s: {w: [] for w in workloads} for s in sets}
      loads = [abrun.load()]
      if "interleaved" in mode:
        for proc in interleaved(mode, sets, workloads, args.rounds, 0 if mode.startswith("2proc") else args.cores):
          for w in workloads:
            for s in sets:
              medians[s][w] += proc["medians"][w][s]
        loads.append(abrun.load())
      else:
        for r in range(args.rounds):
          for s in sets:
            for proc in run_set(SETS[s], mode, workloads, cache_dir):
              for w in workloads:
                medians[s][w].append(statistics.median(proc["times"][w]))
            loads.append(abrun.load())
            print(f"{mode} round {r} {s}: " + ", ".join(f"{w} {1e3 * medians[s][w][-1]:.2f}" for w in workloads),
                  flush=True)
      lines += table(mode, sets, workloads, medians, loads)
  head = [f"- machine: {machine()}", f"- jax {_version()}; load {load_before:.1f} at the start, {abrun.load():.1f} "
          f"at the end; {time.time() - started:.0f} s", f"- command: `{abrun.command()}`", ""]
  abrun.append(args.out, " ".join(argv), "\n".join(head + lines))


def _version() -> str:
  import importlib.metadata
  return f"{importlib.metadata.version('jax')}, jaxlib {importlib.metadata.version('jaxlib')}"


if __name__ == "__main__":
  main(sys.argv[1:])
