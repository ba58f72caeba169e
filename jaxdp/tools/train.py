"""`python -m jaxdp.train --config CONFIG.py --workdir DIR [--config.key=value ...] [--cpu_devices N]`."""

import sys

from jaxdp.runtime import exits
from jaxdp.tools import cli

USAGE = "python -m jaxdp.train --config CONFIG.py --workdir DIR [--config.key=value ...]"


def main(argv: list[str]) -> int:
  """Runs the CLI; returns the exit status (2 for a config or command-line mistake)."""
  cli.start(argv, USAGE)  # Before JAX, TensorFlow and the loop load: `--help` answers at once.
  from jaxdp.loop import replicas, train
  return cli.main(argv, train.train_and_evaluate,
                  failures=(train.NonFiniteError, replicas.ReplicaMismatchError), usage=USAGE)


if __name__ == "__main__":
  exits.exit(main(sys.argv))
