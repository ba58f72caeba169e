"""`python -m jaxdp.audit`: the command `jaxdp.tools.audit`, which `import jaxdp.audit` also gives."""

from jaxdp import tools

tools.entry_point(__name__, "audit")
