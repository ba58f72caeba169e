"""What the benchmarks share: alternating rounds (A B A B ...), medians and spreads, and reading runs' log lines.

On a shared, noisy machine an absolute time says little; a ratio of two contenders measured in the
same rounds, back to back, says much more. The studies report the median over rounds of per-round
ratios of per-step medians, with a spread (`fmt`: min..max; `fmt_iqr`: the interquartile range, for
many short rounds on a busy machine), and state the machine, the load and the command they ran.
"""

import contextlib
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

# A contender runs `n` steps and returns each step's seconds (it blocks until each step is done).
Contender = Callable[[int], list[float]]
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# A train line of process 0 (an eval line has no %); a single process's lines have no "[0] ".
JAXDP_LINE = re.compile(r"^(?:\[0\] )?step\s+(\d+)/\d+\s+\d+%")
ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=")  # VAR=VALUE.


def time_steps(step: Callable[[], Any], n: int, block: Callable[[Any], Any],
               clock: Callable[[], float] = time.perf_counter) -> list[float]:
  """Seconds of each of `n` calls of `step()`, each waited for with `block(result)`, on `clock`.

  `time.process_time` (the CPU seconds of all the process's threads) is far less disturbed than wall
  time by other jobs on a shared machine, for contenders that do the same kind of work.
  """
  times = []
  for _ in range(n):
    start = clock()
    block(step())
    times.append(clock() - start)
  return times


def alternate(contenders: dict[Any, Contender], rounds: int, steps: int, warmup: int = 3) -> dict[Any, list[float]]:
  """Per-round median step time of each contender, running them in turn A B C A B C ... for `rounds` rounds.

  Each contender first runs `warmup` untimed steps (compilation, buffer allocation).
  """
  for run in contenders.values():
    run(warmup)
  medians: dict[Any, list[float]] = {name: [] for name in contenders}
  for _ in range(rounds):
    for name, run in contenders.items():
      medians[name].append(statistics.median(run(steps)))
  return medians


def in_turn(names: Sequence[Any], r: int) -> list[Any]:
  """`names` in round `r`'s order: each first in turn (A B C, B C A, ...). On these machines a run's place in the
  round moved identical programs' times by 10-17% on the 2-core EPYC machines."""
  k = r % len(names)
  return [*names[k:], *names[:k]]


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
  """Round-by-round ratios a / b (both measured in the same round)."""
  return [x / y for x, y in zip(a, b)]


def spread(values: Sequence[float]) -> dict[str, float]:
  """Median, quartiles, min and max of `values`."""
  q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
  return {"median": statistics.median(values), "q1": q1, "q3": q3, "min": min(values), "max": max(values)}


def fmt(values: Sequence[float], digits: int = 3) -> str:
  """`median (min..max)` with `digits` significant digits."""
  s = spread(values)
  return f"{s['median']:.{digits}g} ({s['min']:.{digits}g}..{s['max']:.{digits}g})"


def fmt_rate(values: Sequence[float]) -> str:
  """`median (min..max)` of rates such as samples/s, in whole units with thousands separators."""
  s = spread(values)
  return f"{s['median']:,.0f} ({s['min']:,.0f}..{s['max']:,.0f})"


def fmt_iqr(values: Sequence[float], digits: int = 3) -> str:
  """`median [q1..q3]`: the median and the interquartile range (robust to a few disturbed rounds)."""
  s = spread(values)
  return f"{s['median']:.{digits}g} [{s['q1']:.{digits}g}..{s['q3']:.{digits}g}]"


def fmt_ms(values: Sequence[float]) -> str:
  """Seconds as `median [q1..q3]` milliseconds."""
  return fmt_iqr([v * 1e3 for v in values])


def cpu_model() -> str:
  """The CPU's model name from /proc/cpuinfo, with its family and model (a VM's name is often "AMD EPYC" alone)."""
  fields: dict[str, str] = {}
  with contextlib.suppress(OSError):
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        if not key.strip():  # The first processor's block ends at the first blank line.
          break
        fields.setdefault(key.strip(), value.strip())
  if "model name" not in fields:
    return platform.processor() or "unknown CPU"
  kind = f", family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields else ""
  return fields["model name"] + kind


def load() -> float:
  """The 1-minute load average."""
  return os.getloadavg()[0]


def command(argv: Sequence[str] | None = None) -> str:
  """The command line that ran this script, as typed from the repository root."""
  argv = sys.argv if argv is None else argv
  return " ".join(["python", os.path.relpath(argv[0])] + list(argv[1:]))


def header(title: str, load_before: float, devices: str, cmd: str | None = None) -> list[str]:
  """The lines every results file starts with: date, machine, load, devices, command."""
  return [
      f"# {title}",
      "",
      f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
      f"- machine: {cpu_model()} ({platform.machine()}), {os.cpu_count()} CPU cores, shared with other jobs; "
      f"1-minute load average {load_before:.1f} at the start, {load():.1f} at the end",
      f"- devices: {devices}",
      f"- command: `{cmd or command()}`",
      "",
  ]


def write(path: str | None, lines: list[str]) -> str:
  """Joins `lines`, prints them, and writes them to `path` when given; returns the text."""
  text = "\n".join(lines).rstrip() + "\n"
  print(text)
  if path:
    with open(path, "w") as f:
      f.write(text)
  return text


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


def rate(stamps: dict[int, float], first: int, last: int, batch: int) -> float:
  """Samples/s between two stamped steps of `batch` samples each."""
  return batch * (last - first) / (stamps[last] - stamps[first])


def self_reported(framework: str, lines: list[tuple[float, str]], workdir: str, first: int, last: int,
                  batch: int) -> float:
  """Samples/s over the same window by the side's own clock ("torch": any side printing JSON lines)."""
  if framework == "torch":
    own = {r["step"]: r["time"] for r in (json.loads(l) for _, l in lines if l.startswith("{")) if "time" in r}
    return rate(own, first, last, batch)
  records = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  times = {r["step"]: r["perf/step_time"] for r in records if "perf/step_time" in r}
  logged = sorted(s for s in times if first < s <= last)
  seconds = sum(times[s] * (s - prev) for prev, s in zip([first, *logged], logged))
  return batch * (last - first) / seconds


def torch_version() -> str:
  """PyTorch's version, as the torch side imports it."""
  return subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                        text=True).stdout.strip()
