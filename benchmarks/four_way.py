"""Where each millisecond goes: jaxdp's CLI vs a plain-JAX loop vs PyTorch, per workload, on 1 and 2 processes.

    python benchmarks/four_way.py [--workloads mlp,gpt] [--procs 1,2] [--sides jaxdp,jax,torch] [--rounds 3] \
        [--steps 'mlp=300,gpt=400'] [--warmup ...] [--log_every ...] [--jaxdp_variant NAME=FLAGS ...] [--commit HEAD] \
        [--out four_way.md]

Workloads (four_way_jax.get_config holds each model and recipe, read by every side): mlp (784-1024-1024-10,
Adam 1e-3, batch 1024, 60,000 synthetic float32 examples in an .npz), cnn (the default digits CNN, batch 128), resnet
(ResNet-18 on synthetic 32x32x3 float32, batch 32), gpt (4 layers, width 128, context 64, batch 12, AdamW with
warmup and cosine, clip 1.0, on 1.4 MB of Python's documentation, `python_docs`). Sides, each a fresh command:
  jaxdp  `FOUR_WAY_WORKLOAD=W python -m jaxdp.train --config benchmarks/four_way_jax.py` (2 processes: through
         `python -m jaxdp.launch --num_processes 2`), jaxdp's defaults; the data as a user gives it (the .npz path
         as dataset.name, the text file as builder_kwargs.path, digits from TFDS), prepared before the first round.
         Eval and checkpoint once, at the last step, after the timed window (as the other sides evaluate once).
  jax    benchmarks/four_way_jax.py: jit step with optax, numpy batches from the same arrays in memory
         (2 processes: jax.distributed and a shard_map step over the 2-device mesh that pmeans the gradients
         raveled into one buffer; side `jax_tree`, for diagnosis: pmean of the tree, one gloo call per leaf).
  torch  benchmarks/four_way_torch.py: an eager loop (1 process) or, through torchrun, a DDP script
         (DistributedSampler + DataLoader over in-memory tensors).
Every round runs every side of a cell in turn, each round starting one side later (A B C, B C A, C A B, ...); cells run in the order of --workloads, --procs.

Metrics: steady-state samples/s = global batch x steps between the first log step >= warmup and the last step /
the seconds between them, by each side's own clock (jaxdp: metrics.jsonl perf/step_time; the others: the time
stamp of their log lines), with the same window measured by this driver's stamps of the lines as they arrive;
medians over rounds with min..max, and per-round ratios jaxdp/jax, jaxdp/torch, jax/torch. jaxdp's split over the
same window from metrics.jsonl's running time/total/* (train: the step calls, dispatch and waiting for the
device; input: waiting for a batch; the rest of the window: host work between steps - metrics, NaN guard,
progress, clocks), so the gap to the plain-JAX step splits into input, step call and host; the whole run's
goodput.json seconds (compile, setup...). Eval loss and accuracy after the same steps on every side.
Writes --out (markdown) and the same path with .json (every run's figures).

Machine time (2-core AVX2 EPYC, estimated from the issue's step times and smoke runs on a loaded machine, 3 rounds
x 3 sides, a fresh command each: 10-25 s of start-up and compilation per run; preparing the data once, the 188 MB
.npz of the mlp into jaxdp's ArrayRecord included, ~1-2 min): mlp 2 procs 300 steps ~7 min, mlp 1 proc ~6 min,
gpt 1 proc 400 steps ~6 min, gpt 2 procs ~6 min, cnn 600 steps ~4 min per procs count, resnet 16 steps ~10 min per
procs count (2-9 s per step of batch 32). The acceptance set (`--workloads mlp,gpt --procs 2,1`) is ~25 min;
`--workloads mlp --procs 2` and `--workloads gpt --procs 1` run the two headline cells alone (~13 min together).
"""

import argparse
import ast
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402
import four_way_jax  # noqa: E402

from jaxdp.tools.launch import free_port  # noqa: E402

HERE = abrun.HERE
SIDES = ("jaxdp", "jax", "torch", "jax_tree")  # jax_tree (diagnosis): plain JAX pmean'ing the tree leaf by leaf.
DEFAULT_SIDES = SIDES[:3]
# Per workload: (steps, warm-up steps left out of the window, log every): long enough for a steady window.
DEFAULTS = {"mlp": (300, 100, 25), "cnn": (600, 200, 50), "resnet": (16, 6, 2), "gpt": (400, 100, 25)}
EXAMPLES = {"mlp": 60_000, "resnet": 5_000}  # Synthetic train examples; test: 1/10 as many.
SHAPES = {"mlp": (28, 28, 1), "resnet": (32, 32, 3)}
SPLIT = ("train", "test")


def synthetic(workload: str, examples: int, path: str) -> None:
  """Fixed-seed float32 inputs and learnable labels (the argmax of a fixed random projection) as an .npz."""
  rng = np.random.default_rng(0)
  shape, n_test = SHAPES[workload], max(examples // 10, 1)
  x = rng.standard_normal((examples + n_test, *shape), dtype=np.float32)
  w = rng.standard_normal((int(np.prod(shape)), 10), dtype=np.float32)
  y = np.argmax(x.reshape(len(x), -1) @ w, axis=1).astype(np.int32)
  np.savez(path, x_train=x[:examples], y_train=y[:examples], x_test=x[examples:], y_test=y[examples:])


def digits(path: str) -> None:
  """jaxdp's digits splits (four_way_torch.digits: the same examples) as NHWC float32 arrays."""
  import four_way_torch
  splits = four_way_torch.digits()
  np.savez(path, **{f"{k}_{s}": v.numpy().transpose(0, 2, 3, 1) if k == "x" else v.numpy().astype(np.int32)
                    for s in SPLIT for k, v in zip("xy", splits[s])})


def text_windows(text_path: str, path: str) -> None:
  """The windows jaxdp's text_file dataset makes of the file for the gpt config (train: its stride; test: seq_len)."""
  from jaxdp.datasets import text_file
  kwargs = four_way_jax.get_config("gpt").dataset.builder_kwargs
  t, stride = kwargs.seq_len, kwargs.stride or kwargs.seq_len
  with tempfile.TemporaryDirectory() as scratch:
    texts = text_file.TextFile(path=text_path, seq_len=t, stride=stride, test_fraction=kwargs.test_fraction,
                               data_dir=scratch)._texts()
  arrays = {}
  for split in SPLIT:
    rows = list(text_file.windows(np.frombuffer(texts[split], np.uint8), t, stride if split == "train" else t))
    arrays[f"x_{split}"] = np.stack([r["inputs"] for r in rows])
    arrays[f"y_{split}"] = np.stack([r["targets"] for r in rows]).astype(np.int32)
  np.savez(path, **arrays)


def prepare(workload: str, into: str, examples: int, tree: str, jaxdp: bool = True) -> tuple[str, list[str]]:
  """Writes the workload's arrays (the .npz the plain-JAX and torch sides read); returns it and jaxdp's data flags.

  With `jaxdp`, jaxdp's dataset is prepared here (TFDS ArrayRecord), so that no timed run pays it."""
  npz = os.path.join(into, f"{workload}.npz")
  flags = [f"--config.dataset.data_dir={os.path.join(into, 'tfds')}"]
  if workload in SHAPES:
    synthetic(workload, examples or EXAMPLES[workload], npz)
    flags.append(f"--config.dataset.name={npz}")
  elif workload == "cnn":
    digits(npz)
    flags = []  # TFDS digits where jaxdp keeps it by default, as the default run reads it.
  else:
    text_path = os.path.join(into, "python_docs.txt")
    with open(text_path, "w", encoding="utf-8") as f:
      f.write(python_docs())
    text_windows(text_path, npz)
    flags.append(f"--config.dataset.builder_kwargs.path={text_path}")
  if not jaxdp:
    return npz, flags
  code = "import sys; from jaxdp import data; from jaxdp.tools import cli; data.load(cli.parse(sys.argv)[0].dataset)"
  cmd = [sys.executable, "-c", code, "--config", config_arg(workload), "--workdir", os.path.join(into, "prep"), *flags]
  env = {**os.environ, **config_env(workload),
         "PYTHONPATH": os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH", "")]))}
  done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
  if done.returncode:
    raise RuntimeError(f"preparing {workload}'s dataset for jaxdp failed:\n{done.stdout}{done.stderr}")
  return npz, flags


def python_docs() -> str:
  """pydoc topics, then the docstrings of the standard library's top-level modules (sorted: reproducible)."""
  from pydoc_data import topics
  parts = [topics.topics[k] for k in sorted(topics.topics)]
  for path in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py"))):
    try:
      tree = ast.parse(open(path, encoding="utf-8").read())
    except (SyntaxError, UnicodeDecodeError):
      continue
    parts += [d for node in ast.walk(tree)
              if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
              and (d := ast.get_docstring(node))]
  return "\n\n".join(parts) + "\n"


def config_arg(workload: str) -> str:
  """The --config value that names the workload's config for jaxdp's CLI (the workload itself: `config_env`)."""
  del workload  # One config file; it reads the workload from the environment.
  return os.path.join(HERE, "four_way_jax.py")


def config_env(workload: str) -> dict[str, str]:
  """The environment that picks `workload` in four_way_jax.py's get_config() for jaxdp's CLI."""
  return {four_way_jax.WORKLOAD_VAR: workload}


def is_variant(side: str) -> bool:
  """A variant of jaxdp's side with flags of its own (`jaxdp_NAME`, --jaxdp_variant)."""
  return side.startswith("jaxdp_")


def is_jaxdp(side: str) -> bool:
  """jaxdp's CLI: the side `jaxdp` or a variant of it."""
  return side == "jaxdp" or is_variant(side)


def context(tmp: str, tree: str, plan: dict[str, tuple[int, int, int]], data: dict | None = None,
            env: dict[str, dict[str, str]] | None = None, seeds: list[int] | None = None,
            variants: dict[str, tuple[str, ...]] | None = None) -> dict:
  """What `measure` reads besides its arguments: the temporary dir, jaxdp's tree, each workload's (steps, warmup,
  log every) and prepared data, each side's environment, the seeds per round, each variant's flags."""
  return {"tmp": tmp, "tree": tree, "plan": plan, "data": dict(data or {}), "env": dict(env or {}),
          "seeds": list(seeds or []), "variants": dict(variants or {})}


def command(side: str, workload: str, procs: int, steps: int, log_every: int, npz: str, data_flags: list[str],
            workdir: str, seed: int | None = None, extra: tuple[str, ...] = ()) -> list[str]:
  """The command line of one run (`seed`: the run's seed of init and data order; None: the config's; `extra`: a
  jaxdp variant's flags)."""
  if is_jaxdp(side):
    train = ["--config", config_arg(workload), "--workdir", workdir, f"--config.num_train_steps={steps}",
             f"--config.log_every_steps={log_every}", f"--config.eval_every_steps={steps}",
             f"--config.checkpoint_every_steps={steps}", *data_flags, *extra]
    train += [] if seed is None else [f"--config.seed={seed}"]
    if procs == 1:
      return [sys.executable, "-m", "jaxdp.train", *train]
    return [sys.executable, "-m", "jaxdp.launch", "--num_processes", str(procs), "--", *train]
  worker = ["--workload", workload, "--data", npz, "--steps", str(steps), "--log_every", str(log_every)]
  worker += [] if seed is None else ["--seed", str(seed)]
  if side in ("jax", "jax_tree"):
    return [sys.executable, os.path.join(HERE, "four_way_jax.py"), *worker, "--num_processes", str(procs),
            "--allreduce", "tree" if side == "jax_tree" else "flat"]
  script = os.path.join(HERE, "four_way_torch.py")
  if procs == 1:
    return [sys.executable, script, *worker]
  return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs), "--master_port",
          str(free_port()), script, *worker]  # A free port: torchrun's 29500 may be another job's.


def window_split(workdir: str, first: int, last: int) -> dict[str, float]:
  """jaxdp's ms per step over the window from metrics.jsonl's running totals: train, input, the rest of the wall."""
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  totals = {r["step"]: r for r in records if "time/total/wall" in r and "perf/step_time" in r}
  a, b = totals[first], totals[last]
  delta = {k.split("/")[-1]: 1e3 * (b[k] - a[k]) / (last - first) for k in b if k.startswith("time/total/")}
  delta["host"] = delta["wall"] - sum(v for k, v in delta.items() if k != "wall")
  return delta


def final_eval(side: str, lines: list[tuple[float, str]], workdir: str) -> dict[str, float]:
  """Eval loss and accuracy after the last step."""
  if is_jaxdp(side):
    records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  else:
    records = [json.loads(line) for _, line in lines if line.startswith("{")]
  evals = [r for r in records if "eval/loss" in r]
  return {k: evals[-1][k] for k in ("eval/loss", "eval/accuracy") if evals and k in evals[-1]}


def measure(side: str, workload: str, procs: int, ctx: dict, index: int) -> dict:
  """One run: samples/s over the steady window (own clock and the driver's stamps), eval, jaxdp's time split."""
  steps, warmup, log_every = ctx["plan"][workload]
  batch = four_way_jax.get_config(workload).batch_size
  name = f"{workload}_{procs}p_{side}_{index}"
  workdir = os.path.join(ctx["tmp"], name)
  seed = ctx["seeds"][index % len(ctx["seeds"])] if ctx["seeds"] else None
  cmd = command(side, workload, procs, steps, log_every, *ctx["data"][workload], workdir, seed,
                ctx["variants"].get(side, ()))
  env = {**(config_env(workload) if is_jaxdp(side) else {}), **ctx["env"].get(side, {})}
  load = abrun.load()
  for attempt in range(2):  # One retry: a shared machine's port clash must not end the study.
    lines, wall, status = abrun.run(cmd, os.path.join(ctx["tmp"], name + ".log"), ctx["tree"], env)
    if not status:
      break
    tail = "\n".join(line for _, line in lines[-40:])
    print(f"{name} (attempt {attempt + 1}) exited with status {status}:\n{tail}", flush=True)
  else:
    raise RuntimeError(f"{name} failed twice (output above)")
  framework = "jaxdp" if is_jaxdp(side) else "torch"  # The two line formats: progress, JSON.
  stamps = abrun.log_steps(framework, lines)
  first, last = abrun.window(stamps, warmup)
  own = abrun.self_reported(framework, lines, workdir, first, last, batch)
  out = {"side": side, "workload": workload, "procs": procs, "round": index, "seed": seed, "attempts": attempt + 1,
         "cmd": shlex.join(f"{k}={v}" for k, v in env.items()) + " " * bool(env) + abrun.shown(cmd).replace(ctx["tmp"], "TMP"), "load_before": load, "load_after": abrun.load(),
         "wall_s": wall, "window": [first, last], "global_batch": batch, "samples_per_s": own,
         "samples_per_s_driver": abrun.rate(stamps, first, last, batch), "ms_per_step": 1e3 * batch / own,
         **final_eval(side, lines, workdir)}
  if is_jaxdp(side):
    out["window_ms"] = window_split(workdir, first, last)
    out["goodput_s"] = json.load(open(os.path.join(workdir, "goodput.json")))["seconds"]
  return out


def gpt_check(tree: str) -> dict[str, float]:
  """four_way_torch.py --check: jaxdp's GPT parameters in the torch GPT, the largest logit difference."""
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH", "")]))}
  done = subprocess.run([sys.executable, os.path.join(HERE, "four_way_torch.py"), "--check"], cwd=tree, env=env,
                        capture_output=True, text=True, check=True)
  return json.loads(done.stdout.strip().splitlines()[-1])


def study(args: argparse.Namespace) -> tuple[list[dict], str]:
  """Every cell's rounds of every side in turn; every run's figures and which jaxdp ran."""
  runs = []
  with tempfile.TemporaryDirectory(prefix="four_way_") as tmp:
    tree, revision = abrun.snapshot(args.commit, os.path.join(tmp, "jaxdp_tree"))
    print(f"jaxdp: {revision}", flush=True)
    ctx = context(tmp, tree, args.plan, env=args.env, seeds=args.seeds, variants=args.variants)
    for workload in args.workloads:
      ctx["data"][workload] = prepare(workload, tmp, args.examples, tree, any(map(is_jaxdp, args.sides)))
      print(f"prepared {workload}", flush=True)
    if "gpt" in args.workloads and "torch" in args.sides:
      args.gpt_check = gpt_check(tree)
      print(f"gpt, the same function: {args.gpt_check}", flush=True)
    for workload in args.workloads:
      for procs in args.procs:
        for r in range(args.rounds):
          for side in abrun.in_turn(args.sides, r):
            result = measure(side, workload, procs, ctx, r)
            runs.append(result)
            print(f"{workload} {procs}p round {r} {side:5}: {result['samples_per_s']:,.0f} samples/s "
                  f"({result['ms_per_step']:.1f} ms/step; driver's stamps {result['samples_per_s_driver']:,.0f}), "
                  f"eval loss {result.get('eval/loss', float('nan')):.4f}, load {result['load_before']:.1f}",
                  flush=True)
  return runs, revision


def isa() -> str:
  """The CPU's vector extensions that matter to XLA:CPU and torch's kernels."""
  with open("/proc/cpuinfo") as f:
    flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
  return ", ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags) or "none listed"


def cells(runs: list[dict]) -> dict[tuple[str, int], dict[str, list[dict]]]:
  """{(workload, procs): {side: runs in round order}}."""
  out: dict = {}
  for run_ in runs:
    out.setdefault((run_["workload"], run_["procs"]), {}).setdefault(run_["side"], []).append(run_)
  return out


def ratio(cell: dict[str, list[dict]], a: str, b: str) -> list[float]:
  """Per-round samples/s ratios a / b (empty when a side did not run)."""
  if a not in cell or b not in cell:
    return []
  return abrun.ratios([r["samples_per_s"] for r in cell[a]], [r["samples_per_s"] for r in cell[b]])


def median(runs: list[dict], key: str) -> float:
  """The median of `key` over the runs that have it (nan if none)."""
  values = [r[key] for r in runs if key in r]
  return statistics.median(values) if values else float("nan")


def acceptance(table: dict) -> list[str]:
  """The issue's acceptance cells, from this run."""
  rows = []
  if r := ratio(table.get(("mlp", 2), {}), "jaxdp", "torch"):
    rows.append(f"| MLP, 2 processes: jaxdp CLI / torchrun DDP samples/s | {abrun.fmt(r)} | >= 1.0 |")
  if r := ratio(gpt := table.get(("gpt", 1), {}), "jaxdp", "torch"):
    rows.append(f"| GPT, 1 process: jaxdp CLI / eager torch samples/s | {abrun.fmt(r)} | >= 1.0 |")
    rows.append(f"| GPT, 1 process: eval loss jaxdp, torch (median) | {median(gpt['jaxdp'], 'eval/loss'):.4f}, "
                f"{median(gpt['torch'], 'eval/loss'):.4f} | jaxdp's no worse |")
  for (workload, procs), cell in table.items():
    for plain, how in (("jax", ""), ("jax_tree", " (pmean per leaf)")):
      if r := ratio(cell, "jaxdp", plain):
        rows.append(f"| {workload}, {procs} process{'es' * (procs > 1)}: jaxdp CLI / plain JAX{how} samples/s "
                    f"| {abrun.fmt(r)} | >= 0.97 |")
  if not rows:  # None of the acceptance's cells in this run (e.g. jaxdp and its variants only).
    return []
  return ["## Acceptance cells (issue 25)", "", "| cell | this run: median (min..max) over rounds | wanted |",
          "| --- | --- | --- |", *rows, ""]


def cell_report(workload: str, procs: int, cell: dict[str, list[dict]]) -> list[str]:
  """One cell: each side's samples/s, ratios per round, eval, jaxdp's split of its step against plain JAX's."""
  any_run = next(iter(cell.values()))[0]
  first, last = any_run["window"]
  lines = [f"## {workload}, {procs} process{'es' * (procs > 1)}", "",
           f"Global batch {any_run['global_batch']}; steady window: steps {first}..{last}; own clocks.", "",
           "| side | samples/s | ms/step | driver's stamps, samples/s | eval loss | eval accuracy | command |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
  for side, runs in cell.items():
    lines.append(f"| {side} | {abrun.fmt_rate([r['samples_per_s'] for r in runs])} "
                 f"| {median(runs, 'ms_per_step'):.1f} | {median(runs, 'samples_per_s_driver'):,.0f} "
                 f"| {median(runs, 'eval/loss'):.4f} | {median(runs, 'eval/accuracy'):.4f} | `{runs[0]['cmd']}` |")
  lines += ["", "Eval loss per round (seed): " + "; ".join(
      f"{side} " + ", ".join(f"{r.get('eval/loss', float('nan')):.4f} ({r.get('seed', 'config')})" for r in runs)
      for side, runs in cell.items()) + "."]
  candidates = (("jaxdp", "jax"), ("jaxdp", "jax_tree"), ("jaxdp", "torch"), ("jax", "torch"), ("jax_tree", "jax"))
  variants = tuple((side, "jaxdp") for side in cell if is_variant(side))
  pairs = [(a, b) for a, b in candidates + variants if ratio(cell, a, b)]
  if pairs:
    lines += ["", "Ratios of samples/s, per round: " + "; ".join(
        f"{a}/{b} {', '.join(f'{x:.3f}' for x in ratio(cell, a, b))} (median {abrun.fmt(ratio(cell, a, b))})"
        for a, b in pairs) + "."]
  if "jaxdp" in cell:
    split = {k: statistics.median(r["window_ms"][k] for r in cell["jaxdp"]) for k in cell["jaxdp"][0]["window_ms"]}
    step = median(cell["jaxdp"], "ms_per_step")
    lines += ["", f"jaxdp's window, ms per step (median over rounds): {step:.2f} by its own clock = train (step calls: "
              f"dispatch, waiting for the device) {split['train']:.2f} + input {split['input']:.2f} + host between "
              f"steps {split['host']:.2f} (+ compile {split['compile']:.2f}, eval {split['eval']:.2f}, checkpoint "
              f"{split['checkpoint']:.2f}; wall {split['wall']:.2f})."]
    if "jax" in cell:
      plain = median(cell["jax"], "ms_per_step")
      lines.append(f"Gap to the plain-JAX step ({plain:.2f} ms): {step - plain:+.2f} ms = input "
                   f"{split['input']:+.2f} + step call beyond plain JAX's whole step {split['train'] - plain:+.2f} "
                   f"+ host {split['host']:+.2f} (+ the rest of the wall {step - split['wall']:+.2f}).")
    seconds = {k: statistics.median(r["goodput_s"][k] for r in cell["jaxdp"]) for k in cell["jaxdp"][0]["goodput_s"]}
    lines.append("Whole run (goodput.json, median s): " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()) + ".")
  return lines + [""]


def report(runs: list[dict], revision: str, load_before: float, check: dict | None = None) -> list[str]:
  """The markdown: header, acceptance cells, one section per cell."""
  lines = abrun.header("Four-way study: jaxdp CLI vs plain JAX vs eager PyTorch / torchrun DDP, end to end",
                       load_before, "every side: its defaults, one device per process; 2 processes over gloo")
  lines += [f"- ISA: {isa()}; jaxdp: {revision}; torch {abrun.torch_version()}",
            "- each side with its own defaults (threads, XLA flags); each run a fresh command; sides alternate, "
            "each round starting one side later"]
  if check:
    lines.append(f"- the same GPT on both sides: jaxdp's initial parameters loaded into the torch GPT give logits "
                 f"within "
                 f"{check['max_abs_logit_difference']:.1e} of jaxdp's (largest logit {check['max_abs_logit']:.2f})")
  lines.append("")
  table = cells(runs)
  lines += acceptance(table)
  for (workload, procs), cell in table.items():
    lines += cell_report(workload, procs, cell)
  return lines


def per_workload(text: str, index: int) -> dict[str, int]:
  """'N' (every workload) or 'mlp=N,gpt=M' -> {workload: N} for one field of DEFAULTS."""
  out = {w: d[index] for w, d in DEFAULTS.items()}
  for part in filter(None, text.split(",")):
    name, _, value = part.rpartition("=")
    for w in ([name] if name else out):
      if w not in out:
        raise argparse.ArgumentTypeError(f"unknown workload {w!r} in {text!r}")
      out[w] = int(value)
  return out


def variant(text: str) -> tuple[str, tuple[str, ...]]:
  """'NAME=FLAGS' -> ('jaxdp_NAME', flags): a jaxdp side with flags of its own."""
  name, eq, flags = text.partition("=")
  if not eq or not name.isidentifier():
    raise argparse.ArgumentTypeError(f"--jaxdp_variant wants NAME=FLAGS, e.g. one=--config.cpu_devices=1, "
                                     f"got {text!r}")
  return f"jaxdp_{name}", tuple(shlex.split(flags))


def side_env(text: str) -> tuple[str, str, str]:
  """'SIDE:VAR=VALUE' -> (side, var, value)."""
  side, _, assignment = text.partition(":")
  var, eq, value = assignment.partition("=")
  if side not in SIDES or not abrun.ENV_WORD.match(assignment):
    raise argparse.ArgumentTypeError(f"--env wants SIDE:VAR=VALUE with SIDE one of {', '.join(SIDES)}, got {text!r}")
  return side, var, value


def csv(choices: tuple) -> Callable[[str], list]:
  """A parser of comma-separated values, each one of `choices` (of their type)."""
  def parse(text: str) -> list:
    values = [type(choices[0])(v) for v in text.split(",") if v]
    if bad := [v for v in values if v not in choices]:
      raise argparse.ArgumentTypeError(f"{bad} not among {choices}")
    return values
  return parse


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workloads", type=csv(four_way_jax.NAMES), default=["mlp", "gpt"])
  parser.add_argument("--procs", type=csv((1, 2)), default=[1, 2], help="Process counts, e.g. 1,2.")
  parser.add_argument("--sides", type=csv(SIDES), default=list(DEFAULT_SIDES))
  parser.add_argument("--rounds", type=int, default=3, help="Rounds of every side in turn, per cell.")
  parser.add_argument("--seeds", type=lambda text: [int(v) for v in text.split(",") if v], default=[],
                      help="Round r runs every side with seed seeds[r %% len] (init, data order), e.g. 0,1,2: the "
                           "eval losses then compare over seeds; default: every run with the config's seed.")
  parser.add_argument("--steps", default="", help="Steps: N, or per workload 'mlp=300,gpt=400' (defaults: "
                      + ", ".join(f"{w} {d[0]}" for w, d in DEFAULTS.items()) + ").")
  parser.add_argument("--warmup", default="", help="Steps left out of the window, as --steps (defaults: "
                      + ", ".join(f"{w} {d[1]}" for w, d in DEFAULTS.items()) + ").")
  parser.add_argument("--log_every", default="", help="Log every this many steps, as --steps (defaults: "
                      + ", ".join(f"{w} {d[2]}" for w, d in DEFAULTS.items()) + ").")
  parser.add_argument("--examples", type=int, default=0, help="Synthetic train examples (0: mlp 60,000, resnet 5,000).")
  parser.add_argument("--env", type=side_env, action="append", default=[],
                      help="SIDE:VAR=VALUE: an environment variable for one side's runs (diagnosis, e.g. "
                      "'jax:XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type='); repeatable.")
  parser.add_argument("--jaxdp_variant", type=variant, action="append", default=[],
                      help="NAME=FLAGS: one more side, jaxdp_NAME, jaxdp's CLI with these flags (each round, after the "
                      "sides); its ratio to jaxdp per round.")
  parser.add_argument("--commit", default="HEAD", help="jaxdp commit to run (extracted); '': the working tree.")
  parser.add_argument("--out", default=os.path.join(HERE, "four_way.md"), help="Markdown; every run in .json.")
  args = parser.parse_args(argv)
  try:
    fields = [per_workload(getattr(args, k), i) for i, k in enumerate(("steps", "warmup", "log_every"))]
  except argparse.ArgumentTypeError as e:
    parser.error(str(e))
  args.plan = {w: tuple(f[w] for f in fields) for w in args.workloads}
  env: dict[str, dict[str, str]] = {}
  for side, var, value in args.env:
    env.setdefault(side, {})[var] = value
  args.env, args.gpt_check = env, None
  args.variants = dict(args.jaxdp_variant)
  args.sides = [*args.sides, *args.variants]
  for w, (steps, warmup, log_every) in args.plan.items():
    if steps < warmup + 2 * log_every:
      parser.error(f"{w}: {steps} steps leave no steady window after --warmup {warmup} with --log_every {log_every}")
  return args


def main(argv: list[str]) -> dict:
  args = parse(argv)
  load_before = abrun.load()
  runs, revision = study(args)
  abrun.write(args.out, report(runs, revision, load_before, args.gpt_check))
  record = {"args": {k: v for k, v in vars(args).items()}, "jaxdp": revision, "load_before": load_before,
            "load_after": abrun.load(), "command": shlex.join(["python", "benchmarks/four_way.py", *argv]),
            "runs": runs}
  with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
    json.dump(record, f, indent=1)
  return record


if __name__ == "__main__":
  main(sys.argv[1:])
