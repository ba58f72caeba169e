"""The process a run lives in: distributed init, simulated CPU devices, quieting, exit handling, the
compilation cache, and the setup every command shares (`process`). Light: nothing here imports JAX at
import time unless it must."""
