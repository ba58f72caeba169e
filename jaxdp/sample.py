"""`python -m jaxdp.sample`: the command `jaxdp.tools.sample`, which `import jaxdp.sample` also gives."""

from jaxdp import tools

tools.entry_point(__name__, "sample")
