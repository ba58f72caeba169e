"""What the loop's wait for its next batch is, and which threads use the cores meanwhile (issue 25).

    PYTHONPATH=experiments python experiments/input_wait.py --window 150:400 -- \
        --config experiments/four_way_config_mlp.py --config.dataset.name=MLP.npz --workdir TMP \
        --config.num_train_steps=420

Runs jaxdp's CLI in this process with `parallel.Prefetcher.__next__` timed: per call in the window, whether a
batch was already queued, the call's wall time and the loop thread's CPU time in it (`time.thread_time`); and
each thread's CPU seconds over the window (/proc/self/task). A call that finds its batch queued yet takes
milliseconds of wall and microseconds of CPU is the loop's thread waiting to run (for a core or the GIL), not
input. Prints markdown.
"""

import argparse
import atexit
import collections
import os
import runpy
import sys
import threading
import time

import numpy as np

from jaxdp import parallel


def thread_cpu() -> dict[str, float]:
  """CPU seconds of each thread of this process, by `name:tid` (Python's name for its own threads)."""
  out, tick = {}, os.sysconf("SC_CLK_TCK")
  python = {str(t.native_id): t.name for t in threading.enumerate()}
  for tid in os.listdir("/proc/self/task"):
    try:
      with open(f"/proc/self/task/{tid}/stat") as f:
        stat = f.read()
    except OSError:
      continue  # The thread ended.
    name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
    out[f"{python.get(tid, name)}:{tid}"] = (int(fields[11]) + int(fields[12])) / tick
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--window", default="150:400", help="Calls of next (steps) measured: FIRST:LAST.")
  parser.add_argument("cli", nargs=argparse.REMAINDER, help="-- then jaxdp.train's flags.")
  args = parser.parse_args()
  first, last = (int(v) for v in args.window.split(":"))
  calls, marks = [], {}
  timed = parallel.Prefetcher.__next__

  def next_timed(self: parallel.Prefetcher):
    queued, cpu, wall = self._queue.qsize(), time.thread_time(), time.perf_counter()
    batch = timed(self)
    calls.append((queued, time.perf_counter() - wall, time.thread_time() - cpu))
    if len(calls) in (first, last):
      marks[len(calls)] = (time.perf_counter(), thread_cpu())
    return batch

  parallel.Prefetcher.__next__ = next_timed
  sys.argv = ["jaxdp.train", *[a for a in args.cli if a != "--"]]
  # The CLI's exit skips the interpreter's teardown but runs atexit's handlers.
  atexit.register(lambda: report(calls[first:last], marks[first], marks[last], " ".join(sys.argv[1:])) if last in marks
                  else print(f"error: {len(calls)} calls of the prefetcher's next, fewer than --window's {last}: more "
                             "steps, or a run with one transfer per step and parallel.prefetch > 0", file=sys.stderr))
  runpy.run_module("jaxdp.train", run_name="__main__")


def report(calls: list, start: tuple, end: tuple, command: str) -> None:
  """The markdown: the waits by whether the batch was queued, then CPU per thread."""
  wall = end[0] - start[0]
  sys.stdout.flush()
  print(f"# Input wait\n\n- command: `python -m jaxdp.train {command}`\n- {len(calls)} calls of next, "
        f"{wall:.1f} s; the thread CPU columns are ms per step\n")
  print("| batch queued at the call | calls | wall ms: median | mean | p90 | loop thread CPU ms: mean |")
  print("| --- | --- | --- | --- | --- | --- |")
  for ready, name in ((True, "yes"), (False, "no")):
    rows = [c for c in calls if (c[0] > 0) == ready]
    if rows:
      ms, cpu = np.array([c[1] for c in rows]) * 1e3, np.array([c[2] for c in rows]) * 1e3
      print(f"| {name} | {len(rows)} | {np.median(ms):.3f} | {ms.mean():.3f} | {np.percentile(ms, 90):.3f} | "
            f"{cpu.mean():.3f} |")
  used = collections.Counter({k: v - start[1].get(k, 0.0) for k, v in end[1].items()})
  print(f"\n| thread | CPU s over the window | ms per step |\n| --- | --- | --- |")
  for name, seconds in used.most_common():
    if seconds > 0:
      print(f"| {name} | {seconds:.2f} | {1e3 * seconds / len(calls):.2f} |")


if __name__ == "__main__":
  main()
