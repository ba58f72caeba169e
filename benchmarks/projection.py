"""Validates jaxdp.tools.projection against real multi-process runs: 1, 2 and 4 gloo processes on this machine.

    python benchmarks/projection.py [--processes 1,2,4] [--batch 128] [--steps 80] [--rounds 3] [--config C.py]

Weak scaling, as the projection models it: every process (1 CPU device each) keeps `--batch` examples per step,
the global batch is P x batch. Measured: `python -m jaxdp.launch --num_processes P --devices_per_process 1` trains
the config for `--steps` steps; the step time is the median `perf/step_time` of metrics.jsonl after the first
quarter (warm-up and compilation). Projected: `projection.project(config, [P], "gloo-localhost", compute_s)`, with
the compute time measured with P processes sharing the cores, as the real run shares them: P concurrent 1-device
processes each time the train step (`projection.compute_seconds`), without communicating; the median of theirs.
Writes projection.md (command, date, machine, load, table) and projection.png next to this file.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from matplotlib.figure import Figure

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def overrides(batch: int, steps: int) -> list[str]:
  """Training flags: the per-process batch, no checkpoints, one evaluation at the end, logs every 5 steps."""
  return [f"--config.num_train_steps={steps}", "--config.log_every_steps=5", f"--config.eval_every_steps={steps}",
          "--config.checkpoint_every_steps=0",
          f"--config.batch_size={batch}"]


def measured(config: str, processes: int, batch: int, steps: int) -> float:
  """Median steady-state step time (s) of a real run of `processes` gloo processes."""
  with tempfile.TemporaryDirectory() as workdir:
    cmd = [sys.executable, "-m", "jaxdp.launch", "--num_processes", str(processes), "--devices_per_process", "1",
           "--", "--config", config, "--workdir", workdir, *overrides(processes * batch, steps)]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, timeout=900)
    return steady_step_time(workdir, steps)


def compute_shared(config: str, processes: int, batch: int, steps: int) -> float:
  """Step time without communication, cores shared as in the real run: `processes` concurrent independent
  1-process, 1-device trainings (`python -m jaxdp.train --cpu_devices 1`); the median of their medians."""
  with tempfile.TemporaryDirectory() as root:
    workdirs = [os.path.join(root, str(i)) for i in range(processes)]
    procs = [subprocess.Popen([sys.executable, "-m", "jaxdp.train", "--config", config, "--workdir", w,
                               "--cpu_devices", "1", *overrides(batch, steps)], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for w in workdirs]
    for p in procs:
      if p.wait(timeout=900):
        raise RuntimeError(f"an independent training failed: {p.args}")
    return statistics.median(steady_step_time(w, steps) for w in workdirs)


def isolated_step(config: str, batch: int) -> float:
  """What `jaxdp.inspect --project` measures: the train step alone, on a device-resident batch, 1 process."""
  code = ("import sys, json; from jaxdp.tools import cli, projection; "
          "config, _ = cli.parse(['x', '--config', sys.argv[1], '--cpu_devices', '1', *sys.argv[2:]], "
          "require_workdir=False); print(json.dumps(projection.compute_seconds(config, warmup=5, steps=40)))")
  out = subprocess.run([sys.executable, "-c", code, config, *overrides(batch, 1)], cwd=ROOT, check=True,
                       capture_output=True, text=True).stdout
  return float(out.strip().splitlines()[-1])


def steady_step_time(workdir: str, steps: int) -> float:
  """Median `perf/step_time` of metrics.jsonl after the first quarter of the run (compilation, warm-up)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return statistics.median(r["perf/step_time"] for r in rows if "perf/step_time" in r and r["step"] > steps // 4)


def projected(config: str, processes: int, batch: int, compute_s: float) -> dict:
  """The projection's row for `processes` devices on gloo-localhost with the given compute time."""
  code = ("import sys, json; from jaxdp.runtime import cpu_devices; from jaxdp.tools import cli, projection; "
          "cpu_devices.simulate(2); "
          "config, _ = cli.parse(['x', '--config', sys.argv[1], *sys.argv[4:]], require_workdir=False); "
          "r = projection.project(config, [int(sys.argv[2])], 'gloo-localhost', float(sys.argv[3])); "
          "print(json.dumps(r))")
  out = subprocess.run([sys.executable, "-c", code, config, str(processes), repr(compute_s), *overrides(batch, 1)],
                       cwd=ROOT, check=True, capture_output=True, text=True).stdout
  return json.loads(out.strip().splitlines()[-1])


def draw(results: list[dict], path: str) -> None:
  """Step time against processes: measured, projected, and the projection's compute part."""
  fig = Figure(figsize=(6, 4), layout="constrained")
  ax = fig.subplots()
  ps = [r["processes"] for r in results]
  ax.plot(ps, [1e3 * r["measured_s"] for r in results], "o-", label="measured (jaxdp.launch, gloo)")
  ax.plot(ps, [1e3 * r["projected_s"] for r in results], "s--", label="projected (alpha-beta, gloo-localhost)")
  ax.plot(ps, [1e3 * r["compute_s"] for r in results], "^:", label="projected: its compute part")
  ax.plot(ps, [1e3 * r["shared_s"] for r in results], "d-.", label="projected, cores split evenly")
  ax.set(xlabel="processes (1 CPU device each)", ylabel="step time, ms", title="Projection vs measured, weak scaling",
         xticks=ps)
  ax.set_ylim(bottom=0)
  ax.legend(fontsize="small")
  fig.savefig(path, dpi=110)


def main() -> None:
  os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"  # Every run and probe compiles, as a first run does.
  parser = argparse.ArgumentParser()
  parser.add_argument("--processes", default="1,2,4")
  parser.add_argument("--batch", type=int, default=128)  # Per process.
  parser.add_argument("--steps", type=int, default=80)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--config", default="jaxdp/configs/default.py")
  parser.add_argument("--out", default=os.path.join(HERE, "projection.md"))
  args = parser.parse_args()
  load_before = abrun.load()
  alone = isolated_step(args.config, args.batch)
  counts = [int(x) for x in args.processes.split(",")]
  compute, real = {p: [] for p in counts}, {p: [] for p in counts}
  for _ in range(args.rounds):  # Rounds alternate the two runs of each P: the other jobs' load moves both alike.
    for p in counts:
      compute[p].append(compute_shared(args.config, p, args.batch, args.steps))
      real[p].append(measured(args.config, p, args.batch, args.steps))
      print(json.dumps({"processes": p, "compute_s": compute[p][-1], "measured_s": real[p][-1]}), flush=True)
  results = []
  for p in counts:
    compute_s = statistics.median(compute[p])
    r = projected(args.config, p, args.batch, compute_s)
    row = r["rows"][0]
    results.append({"processes": p, "compute_s": compute_s, "projected_s": row["step_s"], "comm_s": row["comm_s"],
                    "algorithm": row["algorithm"], "measured_s": statistics.median(real[p]), "report": r,
                    "compute_runs": compute[p], "measured_runs": real[p]})
    results[-1]["shared_s"] = results[0]["compute_s"] * max(1.0, p / os.cpu_count()) + row["comm_s"]

  png = os.path.splitext(args.out)[0] + ".png"
  draw(results, png)
  first = results[0]["report"]
  lines = abrun.header("Scaling projection vs measured: 1, 2, 4 gloo processes", load_before,
                       "P processes x 1 CPU device, gloo collectives over localhost, sharing the cores")
  lines += [f"Config `{args.config}`, weak scaling: {args.batch} examples per process per step (global batch P x "
            f"{args.batch}), {args.steps} steps. Gradients {first['gradient_bytes']:,} bytes in "
            f"{first['allreduce_calls']} all-reduce call(s) ({first['gradient_source']}). Interconnect "
            f"`gloo-localhost`: alpha {first['latency_s'] * 1e6:.0f} us, {first['bytes_per_s'] / 1e9:.2f} GB/s "
            "(jaxdp.report's constants for it). Compute: the step time of P concurrent independent "
            "1-device trainings (`jaxdp.train --cpu_devices 1`, no communication), so that the cores are shared "
            "as in the real run (4 processes oversubscribe 2 cores) and the input pipeline is counted. Measured and "
            "compute: median `perf/step_time` after the first quarter of the run; "
            f"{args.rounds} rounds alternating the two, the median of the rounds (each round's figures below).", "",
            f"The train step alone (what `jaxdp.inspect --project` times: device-resident batch, 1 process) took "
            f"{1e3 * alone:.2f} ms; the 1-process training loop's step {1e3 * results[0]['compute_s']:.2f} ms (the "
            "loop adds its input pipeline and host work, and overlaps some of it with 2 steps in flight): the CLI's "
            "projection leaves that difference out.", "",
            "Second model, `cores shared`: compute = the 1-process step x max(1, P / cores), as if the processes "
            f"split the {os.cpu_count()} cores evenly, plus the same all-reduce model.", "",
            "| processes | compute ms (concurrent trainings) | all-reduce ms (model) | projected step ms "
            "| measured step ms | projected / measured | cores-shared projection ms | its / measured |",
            "| --- " * 8 + "|"]
  for r in results:
    lines.append(f"| {r['processes']} | {1e3 * r['compute_s']:.2f} | {1e3 * r['comm_s']:.2f} ({r['algorithm']}) | "
                 f"{1e3 * r['projected_s']:.2f} | {1e3 * r['measured_s']:.2f} | "
                 f"{r['projected_s'] / r['measured_s']:.2f} | {1e3 * r['shared_s']:.2f} | "
                 f"{r['shared_s'] / r['measured_s']:.2f} |")
  lines += ["", "Each round, ms (compute / measured): " + "; ".join(
      f"P = {r['processes']}: " + ", ".join(f"{1e3 * c:.1f} / {1e3 * m:.1f}" for c, m in
                                            zip(r["compute_runs"], r["measured_runs"])) for r in results)]
  lines += ["", f"![projection vs measured]({os.path.basename(png)})"]
  abrun.write(args.out, lines)


if __name__ == "__main__":
  main()
