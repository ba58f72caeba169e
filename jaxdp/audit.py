"""`python -m jaxdp.audit`: the command's code lives in `jaxdp.tools.audit`; `jaxdp.audit` is that module."""

import importlib
import runpy
import sys

if __name__ == "__main__":
  runpy.run_module("jaxdp.tools.audit", run_name="__main__")
else:
  sys.modules[__name__] = importlib.import_module("jaxdp.tools.audit")
