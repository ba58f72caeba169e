"""XLA:CPU's compile settings against the first one given: compile seconds of a short jaxdp run and whether its final
parameters keep the same bits (the test suite's settings: tests/conftest.py).

A setting is `default` (XLA_FLAGS unset) or an LLVM level (`--xla_backend_optimization_level`), with `+loops` for
XLA:CPU's loop emitters instead of its fusion emitters (`--xla_cpu_use_fusion_emitters=false`; XLA before 0.11).
Each run is a fresh process (XLA reads XLA_FLAGS once), settings in turn per round: `train_and_evaluate` on
`digits` (prepared once, first), 8 simulated CPU devices, plain and invariant mode; XLA's backend compile seconds
(jax.monitoring) and the run's wall.

    python benchmarks/compile_level.py --settings default,1,0+loops --models mlp,cnn --rounds 3 [--out FILE.md]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import abrun

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def child(model: str, invariant: bool, data_dir: str, out: str) -> None:
  """One run in this process: its compile seconds and wall as JSON on stdout, its parameters saved to `out`."""
  import time
  from jaxdp.runtime import cpu_devices
  cpu_devices.simulate(8)
  import jax
  import numpy as np
  import jaxdp
  from jaxdp.configs import default
  jax.config.update("jax_enable_compilation_cache", False)  # Every program compiled here, none read.
  seconds = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, duration, **_: seconds.append(duration) if event == COMPILE_EVENT else None)
  config = default.get_config()
  config.dataset.data_dir = data_dir
  config.model.name, config.batch_size, config.num_train_steps = model, 64, 4
  config.log_every_steps = config.eval_every_steps = 4
  config.checkpoint_every_steps = 0
  config.parallel.invariant = invariant
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as workdir:
    result = jaxdp.train_and_evaluate(config, workdir)
  np.savez(out, *[np.asarray(leaf) for leaf in jax.tree.leaves(result.params)])
  print(json.dumps({"compile": sum(seconds), "wall": time.perf_counter() - start}))


def xla_flags(setting: str) -> str:
  """XLA_FLAGS for a setting: "" for `default`, else its LLVM level and, with `+loops`, the loop emitters."""
  if setting == "default":
    return ""
  level, _, loops = setting.partition("+")
  return f"--xla_backend_optimization_level={int(level)}" + (" --xla_cpu_use_fusion_emitters=false" if loops else "")


def run(setting: str, model: str, invariant: bool, data_dir: str, out: str) -> dict[str, float]:
  """`child` in a fresh process under `setting`."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  if flags := xla_flags(setting):  # `default`: XLA_FLAGS unset.
    env["XLA_FLAGS"] = flags
  done = subprocess.run([sys.executable, __file__, "--child", model, str(int(invariant)), data_dir, out], env=env,
                        capture_output=True, text=True, check=True)
  return json.loads(done.stdout.strip().splitlines()[-1])


def same_bits(a: str, b: str) -> bool:
  import numpy as np
  with np.load(a) as x, np.load(b) as y:
    return x.files == y.files and all(x[k].tobytes() == y[k].tobytes() for k in x.files)


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--settings", default="default,1,0+loops")
  parser.add_argument("--models", default="mlp,cnn")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--out")
  args = parser.parse_args(argv)
  settings, load = args.settings.split(","), abrun.load()
  lines = abrun.header("XLA:CPU compile settings: compile seconds and bits", load, "8 simulated CPU devices")
  lines += ["", f"| model | mode | setting | compile s, median (min..max) | run wall s | / {settings[0]} compile | "
                f"same bits as {settings[0]} |", "| --- | --- | --- | --- | --- | --- | --- |"]
  with tempfile.TemporaryDirectory() as tmp:
    import ml_collections
    from jaxdp import data
    data.load(ml_collections.ConfigDict({"name": "digits", "data_dir": tmp}))  # Prepared once, outside the runs.
    for model in args.models.split(","):
      for invariant in (False, True):
        times = {setting: [] for setting in settings}
        for r in range(args.rounds):
          for setting in abrun.in_turn(settings, r):
            times[setting].append(run(setting, model, invariant, tmp, os.path.join(tmp, f"{setting}.npz")))
        base = [t["compile"] for t in times[settings[0]]]
        for setting in settings:
          compile_s = [t["compile"] for t in times[setting]]
          lines.append(f"| {model} | {'invariant' if invariant else 'plain'} | {setting} | {abrun.fmt(compile_s)} | "
                       f"{statistics.median(t['wall'] for t in times[setting]):.2f} | "
                       f"{abrun.fmt(abrun.ratios(compile_s, base))} | "
                       f"{same_bits(os.path.join(tmp, f'{settings[0]}.npz'), os.path.join(tmp, f'{setting}.npz'))} |")
  abrun.write(args.out, lines)


if __name__ == "__main__":
  if sys.argv[1:2] == ["--child"]:
    child(sys.argv[2], sys.argv[3] == "1", sys.argv[4], sys.argv[5])
  else:
    main(sys.argv[1:])
