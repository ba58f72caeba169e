"""`python -m jaxdp.inspect`: the command's code lives in `jaxdp.tools.inspect`; `jaxdp.inspect` is that module."""

import importlib
import runpy
import sys

if __name__ == "__main__":
  runpy.run_module("jaxdp.tools.inspect", run_name="__main__")
else:
  sys.modules[__name__] = importlib.import_module("jaxdp.tools.inspect")
