"""The training loop's own cost per step, apart from the step, and where input time goes (issue 25).

    python experiments/loop_overhead.py --workload gpt --devices 1 [--rounds 5] [--steps 300] [--data resident]
    python experiments/loop_overhead.py --workload cnn --devices 8 [--rounds 5] [--steps 300] [--data stream]
    python experiments/loop_overhead.py --put --devices 8

Contenders, alternating every round (A B C A B C ...), each a fresh run of `--steps` timed steps after warm-up:
  jaxdp   `jaxdp.train_and_evaluate` with the workload's config (log every 25 steps, the replica check, the
          NaN guard, the progress reporter, goodput's clocks; eval only after the last step, no checkpoints);
  inline  the same, with the prefetch of before issue 25 (host batches read and placed in the loop's thread,
          `size` ahead) in place of `parallel.prefetch`'s thread (`--data stream` only);
  bare    a hand-written loop over the same compiled step and device batch: dispatch, wait for the step
          `MAX_STEPS_IN_FLIGHT` back, fetch the metrics every 25 steps (`--data resident` only).
`--data resident`: every step trains one device batch placed once (the loop's own cost, no input);
`--data stream`: the workload's real train stream. A step's time is the wall time between consecutive
dispatches over the timed steps (the steps in flight are bounded, so dispatches follow the device). The
loop's own work is the loop thread's CPU time per step (`time.thread_time`) beyond `bare`'s: waits cost no
CPU, XLA computes on its own threads, so that difference holds on a loaded machine where wall times do not.
`--put`: instead, whether `Backend.put_batch` waits for a step running on the devices (a wait on the devices
booked as input would be a goodput bug), and one placement call per batch against one per array.
`--workload gpt`: configs/gpt_token_file.py on a random token file, at the issue's small shape (context 64,
batch 12; `--shape default` for the config's own 256 x 32); `cnn`: configs/default.py (digits); `mlp`: the four-way
study's MLP on its synthetic .npz (four_way_configs.py).
"""

import sys

from jaxdp.runtime import cpu_devices

if __name__ == "__main__":  # Before JAX is imported: XLA reads XLA_FLAGS once.
  cpu_devices.simulate(int(sys.argv[sys.argv.index("--devices") + 1]) if "--devices" in sys.argv else 1)

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402

from jaxdp import build, parallel  # noqa: E402
from jaxdp.configs import default, gpt_token_file  # noqa: E402
from jaxdp.datasets import token_file  # noqa: E402
from jaxdp.loop import goodput  # noqa: E402
from jaxdp.loop import train as train_lib  # noqa: E402
from jaxdp.loop.step_metrics import steps_in_flight  # noqa: E402
from jaxdp.report import progress  # noqa: E402

# Untimed steps of each run: past the first log step and the first replica check (check_replicas_every_steps
# 100), which compile their programs; the timed steps then hold the periodic work as it recurs.
WARMUP = 110
LOG_EVERY = 25


def workload_config(name: str, shape: str, tmp: str, steps: int, devices: int) -> ml_collections.ConfigDict:
  """The workload's config for `steps` steps on `devices` devices, no eval, no checkpoints."""
  if name == "gpt":
    config = gpt_token_file.get_config()
    path = os.path.join(tmp, "tokens.bin")
    if not os.path.exists(path):
      token_file.write(np.random.default_rng(0).integers(0, 256, 2**20).astype(np.uint16), path, vocab_size=256)
    config.dataset.builder_kwargs.path = path
    config.dataset.builder_kwargs.test_fraction = 0.01  # The eval after the last step: short, and not timed.
    if shape == "small":  # The small GPT.
      config.batch_size, config.dataset.builder_kwargs.seq_len = 12, 64
  elif name == "mlp":  # The four-way study's MLP (784-1024-1024-10, batch 1024) on its synthetic .npz.
    import four_way
    import four_way_configs
    config = four_way_configs.get_config("mlp")
    config.dataset.name = os.path.join(tmp, "mlp.npz")
    if not os.path.exists(config.dataset.name):
      four_way.synthetic("mlp", four_way.EXAMPLES["mlp"], config.dataset.name)
    config.dataset.data_dir = os.path.join(tmp, "tfds")
  else:
    config = default.get_config()
    config.dataset.data_dir = os.path.join(tmp, "tfds")
  config.num_train_steps = steps
  config.log_every_steps = LOG_EVERY
  config.eval_every_steps = 10**9  # Only at the last step, which is not timed.
  config.checkpoint_every_steps = 0
  config.parallel.num_devices = devices
  return config


def inline_prefetch(backend: parallel.Backend, batches: Iterator, size: int,
                    put: Callable | None = None) -> Iterator:
  """The prefetch before issue 25: each next() reads and places a batch (or block: `put`) in the loop's thread,
  `size` ahead."""
  put = put or backend.put_batch
  queue: collections.deque = collections.deque()
  for batch in batches:
    queue.append(put(batch))
    if len(queue) > size:
      yield queue.popleft()
  yield from queue


def resident_prefetch(backend: parallel.Backend, batches: Iterator, size: int,
                      put: Callable | None = None) -> Iterator:
  """One device batch (or block, with `put`), placed once, for every step: the loop without input.

  A block is yielded as one step's worth (`blocks.repeat` asks a (block, real steps) pair); a step past the
  block's steps takes its last batch (dynamic indexing clamps), which is all a step without input needs.
  """
  del size
  first = next(iter(batches))
  placed = put(first) if put else backend.put_batch(first)
  while True:
    yield (placed[0], 1) if put else placed


class Patched:
  """Swaps `parallel.prefetch` for a run, and records the time of every step's dispatch."""

  def __init__(self, prefetch: Callable | None):
    self.prefetch, self.times, self.cpu = prefetch, [], []

  def __enter__(self) -> "Patched":
    self._saved = (parallel.prefetch, progress.Reporter.on_step)
    if self.prefetch is not None:  # As parallel.Inline: the loop books every `next` of these as input.
      parallel.prefetch = lambda *args, **kwargs: parallel.Inline(self.prefetch(*args, **kwargs), lambda x: x)
    real_on_step, times, cpu = progress.Reporter.on_step, self.times, self.cpu

    def on_step(reporter: progress.Reporter, step: int) -> None:
      times.append(time.perf_counter())
      cpu.append(time.thread_time())
      real_on_step(reporter, step)

    progress.Reporter.on_step = on_step
    return self

  def __exit__(self, *exc: Any) -> None:
    parallel.prefetch, progress.Reporter.on_step = self._saved


def step_seconds(times: list[float]) -> float:
  """Mean seconds per step over the timed steps (after WARMUP, the last step left out: it ends the run)."""
  timed = times[WARMUP:-1]
  return (timed[-1] - timed[0]) / (len(timed) - 1)


def run_jaxdp(config: ml_collections.ConfigDict, tmp: str, prefetch: Callable | None) -> dict[str, float]:
  """One run of train_and_evaluate: seconds per step, and goodput's input seconds per step."""
  workdir = tempfile.mkdtemp(dir=tmp)
  with Patched(prefetch) as patched:
    train_lib.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, goodput.FILE)) as f:
    seconds = json.load(f)["seconds"]
  return {"step": step_seconds(patched.times), "cpu": step_seconds(patched.cpu),
          "input": seconds["input"] / config.num_train_steps}


def run_bare(config: ml_collections.ConfigDict) -> dict[str, float]:
  """The same step and device batch in a hand-written loop: dispatch, bound the steps in flight, fetch."""
  parts = build.build(config)
  backend = parts.backend
  state = backend.init(parts.init)
  feed = parts.feed
  batch = abrun.jaxdp_first_input(parts)  # The first step's, placed as the loop places it.
  bound, pending, times, cpu = steps_in_flight(config, backend), [], [], []
  for step in range(1, config.num_train_steps + 1):
    state, step_metrics = feed.train_step(state, batch)
    pending.append(step_metrics)
    if bound and len(pending) > bound:
      jax.block_until_ready(pending[-bound - 1]["nonfinite"])
    if step % LOG_EVERY == 0:
      backend.get(pending)
      pending = []
    times.append(time.perf_counter())
    cpu.append(time.thread_time())
  jax.block_until_ready(state)
  return {"step": step_seconds(times), "cpu": step_seconds(cpu), "input": 0.0}


def put_study(rounds: int) -> list[str]:
  """put_batch's wall time idle and while a long step runs; CPU per batch of one call against one per array."""
  import jax.numpy as jnp
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P
  lines = ["| backend | put_batch idle (wall) | put_batch while a step runs (wall) | batch ready after the step's "
           "dispatch | the step | one call per array (CPU) | one call per batch (CPU) |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
  batch = {"inputs": np.random.rand(128, 8, 8, 1).astype(np.float32), "labels": np.arange(128, dtype=np.int32)}
  for name in ("mesh", "pmap"):
    backend = parallel.make_backend(name)
    n = backend.num_devices
    work = lambda x: jnp.sum(jax.lax.fori_loop(0, 30, lambda i, a: jnp.tanh(a @ a), x))  # noqa: E731
    if name == "mesh":
      long = jax.jit(jax.shard_map(lambda x: work(x)[None], mesh=backend.mesh, in_specs=P("data"), out_specs=P("data")))
      x = jax.device_put(np.random.rand(n * 256, 256).astype(np.float32), NamedSharding(backend.mesh, P("data")))
      per_array = lambda: {k: jax.make_array_from_process_local_data(backend.sharded, v)  # noqa: E731
                           for k, v in batch.items()}
    else:
      long = jax.pmap(work)
      sharding = NamedSharding(backend._local_mesh, P("data"))
      x = jax.device_put(np.random.rand(n, 256, 256).astype(np.float32), sharding)
      per_array = lambda: {k: jax.device_put(v.reshape(n, -1, *v.shape[1:]), sharding)  # noqa: E731
                           for k, v in batch.items()}
    jax.block_until_ready((long(x), backend.put_batch(batch), per_array()))
    idle, busy, ready, step = [], [], [], []
    for _ in range(rounds):
      began = time.perf_counter()
      jax.block_until_ready(backend.put_batch(batch))
      idle.append(time.perf_counter() - began)
      began = time.perf_counter()
      out = long(x)
      put_began = time.perf_counter()
      placed = backend.put_batch(batch)
      busy.append(time.perf_counter() - put_began)
      jax.block_until_ready(placed)
      ready.append(time.perf_counter() - began)
      jax.block_until_ready(out)
      step.append(time.perf_counter() - began)
    cpu = {}
    for label, put in (("array", per_array), ("batch", lambda: backend.put_batch(batch))):
      cpu[label] = []
      for _ in range(rounds):
        began = time.thread_time()
        for _ in range(50):
          jax.block_until_ready(put())
        cpu[label].append((time.thread_time() - began) / 50)
    lines.append(f"| {name} | {abrun.fmt_ms(idle)} ms | {abrun.fmt_ms(busy)} ms | {abrun.fmt_ms(ready)} ms | "
                 f"{abrun.fmt_ms(step)} ms | {abrun.fmt_ms(cpu['array'])} ms | {abrun.fmt_ms(cpu['batch'])} ms |")
  return lines


def measure(args: argparse.Namespace, tmp: str) -> tuple[ml_collections.ConfigDict, dict[str, list[dict[str, float]]]]:
  """The workload's config, and each contender's runs (alternating, `args.rounds` each), with data under `tmp`."""
  config = workload_config(args.workload, args.shape, tmp, WARMUP + args.steps + 1, args.devices)
  if args.data == "resident":
    contenders = {"jaxdp": lambda: run_jaxdp(config, tmp, resident_prefetch), "bare": lambda: run_bare(config)}
  else:
    contenders = {"jaxdp": lambda: run_jaxdp(config, tmp, None),
                  "inline": lambda: run_jaxdp(config, tmp, inline_prefetch)}
  results: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
  for _ in range(args.rounds):
    for name, run in contenders.items():
      results[name].append(run())
  return config, results


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workload", choices=("gpt", "cnn", "mlp"), default="gpt")
  parser.add_argument("--shape", choices=("small", "default"), default="small")
  parser.add_argument("--devices", type=int, default=1)
  parser.add_argument("--data", choices=("resident", "stream"), default="resident")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--out", default=None)
  parser.add_argument("--put", action="store_true", help="put_batch's waits and cost instead of the loop")
  args = parser.parse_args(argv)
  load_before = abrun.load()
  if args.put:
    abrun.write(args.out, abrun.header("put_batch: waits and cost", load_before,
                                       f"{jax.device_count()} x {jax.devices()[0].platform}") + [
        f"{args.rounds * 2 + 1} rounds; the digits batch (128 x 8 x 8 x 1 float32, 128 int32 labels); "
        "median [interquartile range] over rounds.", "", *put_study(args.rounds * 2 + 1)])
    return
  with tempfile.TemporaryDirectory(prefix="loop_overhead-") as tmp:  # Its data and workdirs: hundreds of MB.
    config, results = measure(args, tmp)
  first, second = results
  ratio = abrun.ratios([r["step"] for r in results[first]], [r["step"] for r in results[second]])
  shape = f"{config.batch_size} x {config.dataset.builder_kwargs.seq_len}" if args.workload == "gpt" else \
      f"batch {config.batch_size}"
  rows = [f"| {name} | {abrun.fmt_ms([r['step'] for r in rs])} | {abrun.fmt_ms([r['cpu'] for r in rs])} | "
          f"{abrun.fmt_ms([r['input'] for r in rs])} | {abrun.fmt_iqr([100 * r['input'] / r['step'] for r in rs])} |"
          for name, rs in results.items()]
  # The loop's own host work: its thread's CPU seconds per step beyond the other contender's, per round.
  extra = [a["cpu"] - b["cpu"] for a, b in zip(results[first], results[second])]
  share = [100 * (a["cpu"] - b["cpu"]) / a["step"] for a, b in zip(results[first], results[second])]
  lines = abrun.header(f"Loop overhead: {args.workload} ({shape}), {args.data} data", load_before,
                       f"{args.devices} x {jax.devices()[0].platform}") + [
      f"{args.rounds} rounds of {args.steps} timed steps per contender; median [interquartile range] over rounds.",
      "",
      "| contender | ms/step (wall) | loop thread CPU ms/step | input ms/step (goodput) | input % of step |",
      "| --- | --- | --- | --- | --- |",
      *rows,
      "",
      f"**{first} / {second} (wall): {abrun.fmt_iqr(ratio, 4)}** (per round: {', '.join(f'{r:.4f}' for r in ratio)})",
      "",
      f"**{first}'s loop thread CPU beyond {second}'s: {abrun.fmt_ms(extra)} ms/step, "
      f"{abrun.fmt_iqr(share)}% of {first}'s step**",
  ]
  abrun.write(args.out, lines)


if __name__ == "__main__":
  main()
