"""Alternating A/B measurement shared by the experiments: rounds of A B A B ..., per-step medians, ratios.

On a shared, noisy machine an absolute time says little; a ratio of two contenders measured in the
same rounds, back to back, says much more. The studies report the median over rounds of per-round
ratios of per-step medians, with a spread (`fmt`: min..max; `fmt_iqr`: the interquartile range, for
many short rounds on a busy machine), and state the machine, the load and the command they ran.
"""

import contextlib
import datetime
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

# A contender runs `n` steps and returns each step's seconds (it blocks until each step is done).
Contender = Callable[[int], list[float]]


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
  round moved identical programs 10-17% (four_way_zen4_cnn_ab.md, switch_interval.md)."""
  k = r % len(names)
  return [*names[k:], *names[:k]]


def cpu_wall(sides: dict[str, Callable[[int], None]], rounds: int, repeats: int) -> dict[str, list[tuple[float, float]]]:
  """Per round, each side's ms per call of `side(repeats)` by process CPU (all threads) and by wall, the sides in
  turn (`in_turn`); each side first runs 5 calls untimed (compilation, warm-up)."""
  for run in sides.values():
    run(5)
  times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
  for r in range(rounds):
    for name in in_turn(list(sides), r):
      cpu, wall = time.process_time(), time.perf_counter()
      sides[name](repeats)
      times[name].append(((time.process_time() - cpu) / repeats * 1e3, (time.perf_counter() - wall) / repeats * 1e3))
  return times


def stepping(step: Callable[..., tuple[Any, Any]], state: Any, *inputs: Any) -> Callable[[int], None]:
  """A `cpu_wall` side: `run(n)` calls `state, out = step(state, *inputs)` n times, then waits for the last."""
  import jax  # Here, not at the top: a script may set XLA's flags before JAX loads.

  def run(n: int) -> None:
    nonlocal state
    for _ in range(n):
      state, out = step(state, *inputs)
    jax.block_until_ready((state, out))
  return run


def jaxdp_first_input(parts: Any) -> Any:
  """What jaxdp's loop places for the first step of `parts` (jaxdp.build.Parts, one process): the held split and a
  block of row ids, a block of batches, or a batch, as its feed chooses."""
  from jaxdp import data
  config, feed = parts.config, parts.feed
  host = data.train_batches(parts.ds, config.dataset.train_split, seed=config.seed,
                            global_batch=parts.layout.global_batch, start_step=0, process_index=0, process_count=1,
                            stop_step=feed.steps, row_ids=feed.held is not None)
  return next(feed.device_inputs(parts.backend, host, 0, 0)[1])


def jaxdp_stepping(config: Any) -> Callable[[int], None]:
  """`stepping` of jaxdp's train step for `config` (one process), on what its loop places for the first step."""
  from jaxdp import build
  parts = build.build(config)
  return stepping(parts.feed.train_step, parts.backend.init(parts.init), jaxdp_first_input(parts))


def cpu_wall_lines(times: dict[str, list[tuple[float, float]]], a: str, b: str) -> list[str]:
  """`cpu_wall`'s medians (min..max) per side, and the per-round ratios a / b by each clock."""
  lines = [f"{name}: cpu {fmt([c for c, _ in v])}, wall {fmt([w for _, w in v])}" for name, v in times.items()]
  for i, clock in enumerate(("cpu", "wall")):
    lines.append(f"{a} / {b}, {clock}, per round: {fmt([x[i] / y[i] for x, y in zip(times[a], times[b])])}")
  return lines


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


def append(path: str, options: str, table: str) -> None:
  """Prints `table` and, with a `path`, appends it there under a heading: the time, the load, the `options` run."""
  print(table)
  if path:
    with open(path, "a") as f:
      f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M')} UTC, load average {load():.1f}, `{options}`\n\n{table}\n")


def write(path: str | None, lines: list[str]) -> str:
  """Joins `lines`, prints them, and writes them to `path` when given; returns the text."""
  text = "\n".join(lines).rstrip() + "\n"
  print(text)
  if path:
    with open(path, "w") as f:
      f.write(text)
  return text


def module_at(rev: str, path: str, name: str) -> types.ModuleType:
  """The repository's file `path` as it was at git revision `rev`, imported (from a temporary copy) as `name`."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=root, check=True, capture_output=True, text=True).stdout
  with tempfile.TemporaryDirectory(prefix="module_at_") as tmp:
    copy = os.path.join(tmp, f"{name}.py")
    with open(copy, "w") as f:
      f.write(source)
    spec = importlib.util.spec_from_file_location(name, copy)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  return module
