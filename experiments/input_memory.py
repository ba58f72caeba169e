"""Peak memory of a training process against the size of its train split (random access by index).

    python experiments/input_memory.py [--large 4000] [--small 64] [--rounds 2] [--data_dir DIR] \
        [--out experiments/input_memory.md]

Two splits of generated ImageNet-like JPEGs (`synthetic_jpegs`: jaxdp/datasets/synthetic_jpegs.py, about 80 KB each):
`small` and `large` images, prepared once as ArrayRecord. Each run is a fresh process (`--child N`) training a
small MLP on 64 x 64 random-resized crops, 1 CPU device, batch 64, for one epoch of the large split
(the same number of steps for both, so the small split is read many times over); it reports its own peak
RSS (`ru_maxrss`). Runs alternate small, large, small, large, ...; medians.
"""

import argparse
import datetime
import os
import resource
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(num_train: int, steps: int, data_dir: str) -> None:
  """Trains `steps` steps on the split of `num_train` images; prints the peak RSS in MiB."""
  sys.path.insert(0, ROOT)
  os.environ["JAXDP_CPU_DEVICES"] = "1"
  from jaxdp.runtime import cpu_devices
  cpu_devices.simulate(1)
  from jaxdp import train
  from jaxdp.configs import default
  config = default.get_config()
  config.dataset.name = "synthetic_jpegs"
  config.dataset.data_dir = data_dir
  config.dataset.builder_kwargs = {"num_train": num_train, "num_test": 16}
  config.dataset.image_size, config.dataset.flip = 64, True
  config.model.name, config.model.hidden = "mlp", (32,)
  config.batch_size, config.num_train_steps = 64, steps
  config.log_every_steps = config.eval_every_steps = steps
  config.checkpoint_every_steps = config.check_replicas_every_steps = 0
  with tempfile.TemporaryDirectory() as workdir:
    train.train_and_evaluate(config, workdir)
  print(f"peak_rss_mib {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}")


def split_mib(data_dir: str, num_train: int) -> float:
  """Bytes of the prepared train shards, MiB."""
  total = 0
  for folder, _, files in os.walk(os.path.join(data_dir, "synthetic_jpegs")):
    if f"n{num_train}-16" in folder:
      total += sum(os.path.getsize(os.path.join(folder, f)) for f in files if "-train." in f)
  return total / 2**20


def run(num_train: int, steps: int, data_dir: str) -> float:
  out = subprocess.run([sys.executable, __file__, "--child", str(num_train), "--steps", str(steps),
                        "--data_dir", data_dir], capture_output=True, text=True, check=True).stdout
  return float(next(line.split()[1] for line in out.splitlines() if line.startswith("peak_rss_mib")))


def _runs(values: list[float]) -> str:
  return ", ".join(f"{x:.0f}" for x in values)


def main(argv: list[str]) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--large", type=int, default=4000)
  p.add_argument("--small", type=int, default=64)
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--data_dir", default=os.path.join(tempfile.gettempdir(), "jaxdp-input-memory"))
  p.add_argument("--out", default=None)
  p.add_argument("--child", type=int, default=None)
  p.add_argument("--steps", type=int, default=0)
  args = p.parse_args(argv)
  steps = args.steps or args.large // 64
  if args.child is not None:
    return child(args.child, steps, args.data_dir)
  peaks = {args.small: [], args.large: []}
  for _ in range(args.rounds):
    for n in (args.small, args.large):
      peaks[n].append(run(n, steps, args.data_dir))
      print(n, peaks[n][-1], flush=True)
  small, large = (statistics.median(peaks[n]) for n in (args.small, args.large))
  sizes = {n: split_mib(args.data_dir, n) for n in peaks}
  report = "\n".join([
      "# Peak memory against the train split's size",
      "",
      f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}; {os.cpu_count()} CPU cores",
      f"- command: `python experiments/input_memory.py {' '.join(argv)}`",
      f"- each run: a fresh process, mlp on 64 x 64 random-resized crops, 1 CPU device, batch 64, {steps} steps "
      f"(one epoch of the large split); {args.rounds} runs per split, alternating; peak RSS (ru_maxrss), median",
      "",
      "| train split | encoded JPEGs (ArrayRecord) | peak RSS MiB (runs) |",
      "| --- | --- | --- |",
      f"| small: {args.small} images | {sizes[args.small]:.1f} MiB | {small:.0f} ({_runs(peaks[args.small])}) |",
      f"| large: {args.large} images | {sizes[args.large]:.1f} MiB | {large:.0f} ({_runs(peaks[args.large])}) |",
      "",
      f"The large split is {sizes[args.large] - sizes[args.small]:.0f} MiB larger; the peak RSS grew by "
      f"{large - small:.0f} MiB.",
  ]) + "\n"
  print(report)
  if args.out:
    with open(args.out, "w") as f:
      f.write(report)


if __name__ == "__main__":
  main(sys.argv[1:])
