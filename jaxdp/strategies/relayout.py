"""TEMPORARY (issue 23): checkpoint.py's old import until it asks the strategy (`Strategy.stored_opt_layout`,
`Strategy.relayout_opt_state`); delete this file then."""

from typing import Any

from jaxdp.strategies.zero1_layout import relayout, stored_layout  # noqa: F401


def apply(opt_state: Any, wanted: Any, num_shards: int, shardings: Any) -> Any:
  del num_shards  # The wanted layout says it.
  return relayout(opt_state, wanted, shardings)
