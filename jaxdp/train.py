"""`python -m jaxdp.train` (the command `jaxdp.tools.train`) and `train_and_evaluate`, as users import them."""

import runpy

if __name__ == "__main__":
  runpy.run_module("jaxdp.tools.train", run_name="__main__")
else:
  from jaxdp.loop.train import NonFiniteError, Result, train_and_evaluate  # noqa: F401
  from jaxdp.tools.train import main  # noqa: F401
