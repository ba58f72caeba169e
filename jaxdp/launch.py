"""`python -m jaxdp.launch`: the command's code lives in `jaxdp.tools.launch`; `jaxdp.launch` is that module."""

import importlib
import runpy
import sys

if __name__ == "__main__":
  runpy.run_module("jaxdp.tools.launch", run_name="__main__")
else:
  sys.modules[__name__] = importlib.import_module("jaxdp.tools.launch")
