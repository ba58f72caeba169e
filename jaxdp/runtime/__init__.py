"""The process a run lives in: distributed init, simulated CPU devices, quieting, exit handling,
the compilation cache. Light: nothing here imports JAX at import time unless it must."""
