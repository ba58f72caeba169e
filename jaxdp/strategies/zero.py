"""TEMPORARY (issue 23): the old name of `jaxdp.strategies.zero1_layout` until the tests import that; delete then."""

from jaxdp.strategies.zero1_layout import flatten, state_specs, unflatten  # noqa: F401
