"""End to end: jaxdp's CLI through `jaxdp.launch` against a standard torchrun DDP script, 2 processes on CPU.

    python experiments/e2e_compare.py [--rounds 3] [--steps 1500] [--warmup 200] [--log_every 50] \
        [--out experiments/e2e_compare.md] [--variant 'NAME=LAUNCH_FLAGS [-- TRAIN_FLAGS]' ...]

Each round runs, one after the other (A B A B ...), as separate commands from a cold process:
  A  python -m jaxdp.launch --num_processes 2 -- --config jaxdp/configs/default.py --workdir FRESH_TMP
       --config.num_train_steps=STEPS --config.log_every_steps=LOG --config.eval_every_steps=STEPS
       --config.checkpoint_every_steps=STEPS
     jaxdp's defaults otherwise: tfds `digits` read by index, its launcher's defaults (1 device per process, no
     pinning), the persistent compilation cache, the replica check, JAX's preemption service.
     Eval and checkpoint happen once, at the last step (after the last timed window), as the torch script
     evaluates once at the end and saves nothing: both sides do the same work inside the window.
  B  python -m torch.distributed.run --nproc_per_node 2 experiments/e2e_torch.py --steps STEPS --log_every LOG
Same data (digits, same split and scaling), model (jaxdp's default `cnn`), global batch (128), Adam and lr.

Steady state, the same instrument on both sides: this driver stamps each log line of rank 0 as it arrives on
the pipe (both sides print it after the step's loss reached the host), and samples/s = global batch x steps
between the first log step >= --warmup and the last one / the seconds between those two lines. Each side's own
clock gives a second figure (jaxdp: metrics.jsonl `perf/step_time` of those log steps; torch: the `time` of its
lines). Time to the first step (information only): the first log line's arrival minus LOG steady steps.
Writes the table to --out and every run's raw figures to the same path with .json.

Diagnosis: each `--variant NAME='[VAR=VALUE ...] LAUNCH_FLAGS [-- TRAIN_FLAGS]'` adds one jaxdp run
per round with that environment and those flags (e.g. `pin=--pin_cpus`), reported against torch and against
jaxdp's defaults of the same rounds.
"""

import argparse
import itertools
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402

from jaxdp.tools.launch import free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
GLOBAL_BATCH = 128  # jaxdp/configs/default.py's batch_size; the torch script's default --batch_size.
ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=")  # A variant's leading VAR=VALUE words set its environment.
# A train line of process 0 (an eval line has no %); a single process's lines have no "[0] ".
JAXDP_LINE = re.compile(r"^(?:\[0\] )?step\s+(\d+)/\d+\s+\d+%")


def jaxdp_command(steps: int, log_every: int, workdir: str, launch_args: list[str], jaxdp_args: list[str]) -> list[str]:
  """jaxdp's CLI through its launcher, defaults but for the step count and where eval/checkpoints fall."""
  return [sys.executable, "-m", "jaxdp.launch", "--num_processes", "2", *launch_args, "--",
          "--config", "jaxdp/configs/default.py", "--workdir", workdir,
          f"--config.num_train_steps={steps}", f"--config.log_every_steps={log_every}",
          f"--config.eval_every_steps={steps}", f"--config.checkpoint_every_steps={steps}", *jaxdp_args]


def torch_command(steps: int, log_every: int) -> list[str]:
  """The standard torchrun DDP script (experiments/e2e_torch.py), torchrun's defaults."""
  # A free port, not torchrun's default 29500, which another job on a shared machine may hold.
  return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
          os.path.join(HERE, "e2e_torch.py"), "--steps", str(steps), "--log_every", str(log_every)]


def shown(cmd: list[str]) -> str:
  """`cmd` as typed from the repository root."""
  plain = ["python" if c == sys.executable else os.path.relpath(c, REPO) if c.startswith(REPO) else c for c in cmd]
  return " ".join(shlex.quote(c) for c in plain)


def snapshot(commit: str, into: str) -> tuple[str, str]:
  """(directory, description) of the jaxdp to run: `commit` extracted into `into`, or the working tree for ""."""
  git = ["git", "-C", REPO]
  if not commit:
    dirty = subprocess.run(git + ["status", "--porcelain", "--", "jaxdp"], capture_output=True, text=True).stdout
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return REPO, f"working tree at {head}" + (" with uncommitted changes in jaxdp/" if dirty.strip() else "")
  sha = subprocess.run(git + ["rev-parse", "--short", commit], capture_output=True, text=True, check=True)
  sha = sha.stdout.strip()
  os.makedirs(into)
  archive = subprocess.run(git + ["archive", sha, "jaxdp"], capture_output=True, check=True).stdout
  subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
  return into, f"commit {sha} (extracted: others' uncommitted edits in the shared checkout do not leak in)"


def run(cmd: list[str], log_path: str, cwd: str = REPO,
        extra_env: dict[str, str] | None = None) -> tuple[list[tuple[float, str]], float, int]:
  """Runs `cmd` in `cwd`; returns its output lines with their arrival (seconds after the start), the wall time,
  the status. `cwd` goes first on PYTHONPATH: the launcher's processes import jaxdp from there."""
  lines = []
  start = time.perf_counter()
  extra_env = dict(extra_env or {})
  path = [cwd, extra_env.pop("PYTHONPATH", ""), os.environ.get("PYTHONPATH", "")]
  env = {**os.environ, **extra_env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(filter(None, path))}
  with open(log_path, "w") as log, subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                     text=True, env=env) as proc:
    for line in proc.stdout:
      lines.append((time.perf_counter() - start, line.rstrip("\n")))
      log.write(f"{lines[-1][0]:9.3f} {line}")
  return lines, time.perf_counter() - start, proc.returncode


def log_steps(framework: str, lines: list[tuple[float, str]]) -> dict[int, float]:
  """{log step: arrival seconds} of rank 0's train lines."""
  out = {}
  for t, line in lines:
    if framework == "jaxdp":
      if m := JAXDP_LINE.match(line):
        out[int(m.group(1))] = t
    elif line.startswith("{") and '"time"' in line:
      out[json.loads(line)["step"]] = t
  return out


def window(stamps: dict[int, float], warmup: int) -> tuple[int, int]:
  """(first, last) log steps of the steady-state window: from the first log step >= warmup to the last."""
  steps = sorted(stamps)
  first = next(s for s in steps if s >= warmup)
  if first == steps[-1]:
    raise ValueError(f"no log step after warm-up {warmup} (log steps {steps})")
  return first, steps[-1]


def rate(stamps: dict[int, float], first: int, last: int, batch: int = GLOBAL_BATCH) -> float:
  """Samples/s between two stamped steps of `batch` samples each."""
  return batch * (last - first) / (stamps[last] - stamps[first])


def self_reported(framework: str, lines: list[tuple[float, str]], workdir: str, first: int, last: int,
                  batch: int = GLOBAL_BATCH) -> float:
  """Samples/s over the same window by the side's own clock ("torch": any side printing e2e_torch's JSON lines)."""
  if framework == "torch":
    own = {r["step"]: r["time"] for r in (json.loads(l) for _, l in lines if l.startswith("{")) if "time" in r}
    return rate(own, first, last, batch)
  records = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  times = {r["step"]: r["perf/step_time"] for r in records if "perf/step_time" in r}
  logged = sorted(s for s in times if first < s <= last)
  seconds = sum(times[s] * (s - prev) for prev, s in zip([first, *logged], logged))
  return batch * (last - first) / seconds


def extras(framework: str, lines: list[tuple[float, str]], workdir: str) -> dict:
  """What else the run says: torch's test accuracy; jaxdp's eval accuracy and goodput seconds (time/total/*)."""
  if framework == "torch":
    final = [json.loads(l) for _, l in lines if l.startswith("{") and "eval/accuracy" in l]
    return {"eval/accuracy": final[-1]["eval/accuracy"]} if final else {}
  out, steps = {}, 1
  for line in open(os.path.join(workdir, "metrics.jsonl")):
    record = json.loads(line)
    steps = max(steps, record["step"])
    out.update({k: v for k, v in record.items() if k == "eval/accuracy" or k.startswith("time/total/")})
  out["input_ms_per_step"] = 1e3 * out.get("time/total/input", float("nan")) / steps
  return out


def variant(spec: str) -> tuple[str, list[str], list[str], dict[str, str]]:
  """`NAME=[VAR=VALUE ...] LAUNCH_FLAGS [-- TRAIN_FLAGS]` -> (name, launcher flags, jaxdp.train flags, environment)."""
  name, _, flags = spec.partition("=")
  words = shlex.split(flags)
  env = dict(w.split("=", 1) for w in itertools.takewhile(lambda w: ENV_WORD.match(w), words))
  words = words[len(env):]
  cut = words.index("--") if "--" in words else len(words)
  if not name or name in ("jaxdp", "torch"):
    raise argparse.ArgumentTypeError(f"a variant needs a new NAME=FLAGS, got {spec!r}")
  return name, words[:cut], words[cut + 1:], env


def measure(contender: str, args: argparse.Namespace, tmp: str, index: int, tree: str) -> dict:
  """One run of one contender: steady samples/s (driver's stamps and own clock), time to the first step, load."""
  framework = "torch" if contender == "torch" else "jaxdp"
  workdir = os.path.join(tmp, f"{contender}_{index}")
  flags = {"jaxdp": ([], [], {})} | {name: rest for name, *rest in args.variant}
  launch_flags, train_flags, env = flags.get(contender, ([], [], {}))
  cmd = (torch_command(args.steps, args.log_every) if framework == "torch"
         else jaxdp_command(args.steps, args.log_every, workdir, launch_flags, train_flags))
  load = abrun.load()
  for attempt in range(2):  # One retry: a shared machine's port clash must not end a 10-minute study.
    lines, wall, status = run(cmd, os.path.join(tmp, f"{contender}_{index}.log"),
                              tree if framework == "jaxdp" else REPO, env)
    if not status:
      break
    tail = "\n".join(line for _, line in lines[-40:])
    print(f"{contender} run {index} (attempt {attempt + 1}) exited with status {status}:\n{tail}", flush=True)
  else:
    raise RuntimeError(f"{contender} run {index} failed twice (output above)")
  stamps = log_steps(framework, lines)
  first, last = window(stamps, args.warmup)
  steady = rate(stamps, first, last)
  first_log = min(s for s in stamps if s >= args.log_every)
  shown_flags = [f"{k}={v}" for k, v in env.items()] + launch_flags + (["--"] if train_flags else []) + train_flags
  return {"contender": contender, "framework": framework, "flags": shlex.join(shown_flags), "attempts": attempt + 1,
          "cmd": shown(cmd).replace(tmp, "FRESH_TMP"), "load_before": load,
          "load_after": abrun.load(), "wall_s": wall, "exit_after_last_line_s": wall - lines[-1][0],
          "window": [first, last], "samples_per_s": steady,
          "samples_per_s_own_clock": self_reported(framework, lines, workdir, first, last),
          "first_log_step": first_log, "first_log_s": stamps[first_log],
          "time_to_first_step_s": stamps[first_log] - first_log * GLOBAL_BATCH / steady,
          "log_stamps": {str(s): t for s, t in sorted(stamps.items())}, **extras(framework, lines, workdir)}


def study(args: argparse.Namespace) -> tuple[list[dict], str]:
  """`--rounds` rounds of jaxdp, torch, then each variant (A B A B ...); every run's figures, which jaxdp ran."""
  runs = []
  with tempfile.TemporaryDirectory(prefix="e2e_compare_") as tmp:
    tree, revision = snapshot(args.commit, os.path.join(tmp, "jaxdp_tree"))
    print(f"jaxdp: {revision}", flush=True)
    for r in range(args.rounds):
      for contender in ("jaxdp", "torch", *(name for name, *_ in args.variant)):
        result = measure(contender, args, tmp, r, tree)
        result["round"] = r
        runs.append(result)
        print(f"round {r} {contender:5}: {result['samples_per_s']:,.0f} samples/s (own clock "
              f"{result['samples_per_s_own_clock']:,.0f}), first step at {result['time_to_first_step_s']:.1f} s, "
              f"load {result['load_before']:.1f}", flush=True)
  return runs, revision


def report(runs: list[dict], revision: str, load_before: float) -> list[str]:
  """The markdown: header, per-round table, medians with spread."""
  side: dict[str, list[dict]] = {}
  for run_ in runs:
    side.setdefault(run_.get("contender", run_["framework"]), []).append(run_)
  ratio = abrun.ratios([r["samples_per_s"] for r in side["jaxdp"]], [r["samples_per_s"] for r in side["torch"]])
  own = abrun.ratios([r["samples_per_s_own_clock"] for r in side["jaxdp"]],
                     [r["samples_per_s_own_clock"] for r in side["torch"]])
  lines = abrun.header("jaxdp CLI (jaxdp.launch) vs torchrun DDP, end to end, 2 processes", load_before,
                       "2 processes x 1 CPU device each (gloo), both sides")
  lines += [f"- jaxdp: {revision}; torch {torch_version()}",
            f"- jaxdp (A): `{side['jaxdp'][0]['cmd']}`", f"- torch (B): `{side['torch'][0]['cmd']}`",
            f"- steady-state window: log steps {side['jaxdp'][0]['window'][0]}..{side['jaxdp'][0]['window'][1]} "
            f"(global batch {GLOBAL_BATCH})", "",
            "| round | jaxdp samples/s | torch samples/s | jaxdp/torch | same, own clocks | jaxdp first step (s) "
            "| torch first step (s) | load (A, B) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r, (a, b) in enumerate(zip(side["jaxdp"], side["torch"])):
    lines.append(f"| {r} | {a['samples_per_s']:,.0f} | {b['samples_per_s']:,.0f} | {ratio[r]:.3f} | {own[r]:.3f} "
                 f"| {a['time_to_first_step_s']:.1f} | {b['time_to_first_step_s']:.1f} "
                 f"| {a['load_before']:.1f}, {b['load_before']:.1f} |")
  med = lambda key, f: statistics.median(r[key] for r in side[f])  # noqa: E731
  lines += ["", f"**jaxdp/torch samples/s: {abrun.fmt(ratio)}** (median (min..max) over {len(ratio)} rounds; "
            f"own clocks {abrun.fmt(own)}). Time to the first step (median): jaxdp "
            f"{med('time_to_first_step_s', 'jaxdp'):.1f} s, torch {med('time_to_first_step_s', 'torch'):.1f} s. "
            f"Test accuracy (median): jaxdp {med('eval/accuracy', 'jaxdp'):.3f}, "
            f"torch {med('eval/accuracy', 'torch'):.3f}. jaxdp waited {med('input_ms_per_step', 'jaxdp'):.1f} ms "
            "per step for its input (goodput's time/input over all steps, median).", *exits(side), ""]
  return lines + variants(side)


def exits(side: dict[str, list[dict]]) -> list[str]:
  """How long each side's command ran on after its last output line (process exit), when recorded."""
  if not all("exit_after_last_line_s" in r for f in ("jaxdp", "torch") for r in side[f]):
    return []
  seconds = {f: ", ".join(f"{r['exit_after_last_line_s']:.1f}" for r in side[f]) for f in ("jaxdp", "torch")}
  return [f"Seconds from the last output line to the command's exit, per round: jaxdp {seconds['jaxdp']}; "
          f"torch {seconds['torch']}."]


def variants(side: dict[str, list[dict]]) -> list[str]:
  """Diagnosis: each variant's samples/s against torch and against jaxdp's defaults, in the same rounds."""
  names = [n for n in side if n not in ("jaxdp", "torch")]
  if not names:
    return []
  lines = ["## Variants (diagnosis: jaxdp with changed flags, run in the same rounds)", "",
           "| variant | command | samples/s | /torch | /jaxdp defaults | first step (s) | input wait (ms/step) |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
  for name in ["jaxdp", *names]:
    rates = [r["samples_per_s"] for r in side[name]]
    vs = {other: abrun.fmt(abrun.ratios(rates, [r["samples_per_s"] for r in side[other]]))
          for other in ("torch", "jaxdp")}
    lines.append(f"| {name} | `{side[name][0].get('flags') or '(defaults)'}` | {statistics.median(rates):,.0f} "
                 f"| {vs['torch']} | {vs['jaxdp']} "
                 f"| {statistics.median(r['time_to_first_step_s'] for r in side[name]):.1f} "
                 f"| {statistics.median(r['input_ms_per_step'] for r in side[name]):.1f} |")
  return lines + [""]


def torch_version() -> str:
  """PyTorch's version, as the torch side imports it."""
  return subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                        text=True).stdout.strip()


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3, help="Rounds of A (jaxdp) then B (torch).")
  parser.add_argument("--steps", type=int, default=1500, help="Training steps of every run.")
  parser.add_argument("--warmup", type=int, default=200, help="Steps left out of the steady-state window.")
  parser.add_argument("--log_every", type=int, default=50, help="Log (and stamp) every this many steps.")
  parser.add_argument("--variant", type=variant, action="append", default=[],
                      help="NAME='[VAR=VALUE ...] LAUNCH_FLAGS [-- TRAIN_FLAGS]': one more jaxdp run a round.")
  parser.add_argument("--commit", default="HEAD", help="jaxdp commit to run (extracted); '': the working tree.")
  parser.add_argument("--out", default=os.path.join(HERE, "e2e_compare.md"), help="Markdown table; raw runs in .json.")
  args = parser.parse_args(argv)
  if args.steps <= args.warmup + args.log_every:
    parser.error(f"--steps {args.steps} leaves no steady-state window after --warmup {args.warmup}")
  return args


def main(argv: list[str]) -> None:
  args = parse(argv)
  load_before = abrun.load()
  runs, revision = study(args)
  lines = report(runs, revision, load_before)
  abrun.write(args.out, lines)
  with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
    json.dump({"args": vars(args), "jaxdp": revision, "load_before": load_before, "load_after": abrun.load(),
               "runs": runs}, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1:])
