"""The keys jaxdp adds to a dataset's own features in a host batch; a task never sees them."""

INDEX = "_index"  # Each row's example id as read (train streams `with_ids`, for the audit); never trained on.
REAL = "_real"  # Eval batches: True for a real example, False for padding (masked out of every metric).
