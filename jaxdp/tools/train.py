"""`python -m jaxdp.train --config CONFIG.py --workdir DIR [--config.key=value ...] [--cpu_devices N]`."""

import sys

from jaxdp.runtime import exits, process
from jaxdp.tools import cli

USAGE = "python -m jaxdp.train --config CONFIG.py --workdir DIR [--config.key=value ...]"


def main(argv: list[str]) -> int:
  """Parses `argv`, joins the run, trains; returns the exit status (2 for a config or command-line mistake)."""
  cli.start(argv, USAGE)  # Before JAX, TensorFlow and the loop load: `--help` answers at once.
  from jaxdp.loop import replicas, train

  def run() -> None:
    config, workdir = cli.parse(argv, usage=USAGE)
    process.init(config)
    train.train_and_evaluate(config, workdir)

  return cli.execute(argv, USAGE, "", run, failures=(train.NonFiniteError, replicas.ReplicaMismatchError))


if __name__ == "__main__":
  exits.exit(main(sys.argv))
