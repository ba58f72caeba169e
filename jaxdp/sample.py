"""`python -m jaxdp.sample`: the command's code lives in `jaxdp.tools.sample`; `jaxdp.sample` is that module."""

import importlib
import runpy
import sys

if __name__ == "__main__":
  runpy.run_module("jaxdp.tools.sample", run_name="__main__")
else:
  sys.modules[__name__] = importlib.import_module("jaxdp.tools.sample")
