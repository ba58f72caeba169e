"""`python -m jaxdp.inspect`: the command `jaxdp.tools.inspect`, which `import jaxdp.inspect` also gives."""

from jaxdp import tools

tools.entry_point(__name__, "inspect")
