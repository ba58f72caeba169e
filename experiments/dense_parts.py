"""The MLP's dense kernels on XLA:CPU, one flag set against another and against torch, on one thread.

    python experiments/dense_parts.py [--rounds 10] [--sets defaults,defaults+lax,ynn_off,...] [--parts nn_h_w2,...]
        [--cores 1] [--batch 512] [--no-torch] [--hlo SET] [--out experiments/dense_parts.md]

The MLP 784-1024-1024-10 (jaxdp's model) at one process's rows of jaxdp.launch's 2-process run (global batch
1024: 512 rows). Parts: each dot of the forward and backward at its real shapes and layouts (NN: x @ W; NT:
dY @ W^T, the input gradients; TN: X^T @ dY, the weight gradients; NNC: the same weight gradients as
jaxdp.models.dense_dot's backward computes them, X^T copied into its own array, then an NN dot), the whole
forward + backward (jaxdp's MLP, its Linears on dense_dot; a set named SET+lax: on lax.dot_general, as before
dense_dot, under SET's flags), the Adam
update alone, and the whole step (grad + Adam). XLA's flag sets are per-executable compiler options, so every
set runs in this one process and the sets alternate within each round (A B C ..., then reversed): a load that
changes lands on every set alike. Torch runs the same parts (its own layout for the whole model: nn.Linear
keeps W as [out, in]) with torch.set_num_threads(cores). The process pins itself to `--cores` cores before JAX
starts, so XLA's thread pool has that many threads: one, as each of the 2 processes on a 2-core machine
effectively gets. `--hlo SET` prints the optimised HLO of the fwd+bwd under SET (dots, copies, transposes) and
exits. Results: experiments/dense_parts.md.
"""

import argparse
import contextlib
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import abrun  # noqa: E402

YNN = "xla_cpu_experimental_ynn_fusion_type"
ONEDNN = "xla_cpu_experimental_onednn_fusion_type"
T = "LIBRARY_FUSION_TYPE_"
# Per-executable compiler options (the XLA_FLAGS spelling is in FLAGS_TEXT). XLA 0.10.2's default YNNPACK list is
# individual_dot,individual_convolution; the oneDNN list is empty and needs xla_cpu_use_onednn.
SETS: dict[str, dict[str, object]] = {
  "defaults": {},
  "ynn_off": {YNN: ""},  # XLA's own (Eigen) dots.
  "ynn_dot": {YNN: T + "DOT"},  # YNNPACK dots with their elementwise neighbours fused in.
  "ynn_eltwise": {YNN: T + "INDIVIDUAL_DOT," + T + "ELTWISE"},
  "ynn_reduce": {YNN: T + "INDIVIDUAL_DOT," + T + "REDUCE"},
  "onednn_dot": {YNN: "", "xla_cpu_use_onednn": True, ONEDNN: T + "DOT"},
  "onednn_individual_dot": {YNN: "", "xla_cpu_use_onednn": True, ONEDNN: T + "INDIVIDUAL_DOT"},
  "vector512": {"xla_cpu_prefer_vector_width": 512},
  "vector128": {"xla_cpu_prefer_vector_width": 128},
}
FLAGS_TEXT = {
  "defaults": "(none)",
  "ynn_off": "--xla_cpu_experimental_ynn_fusion_type=",
  "ynn_dot": "--xla_cpu_experimental_ynn_fusion_type=dot",
  "ynn_eltwise": "--xla_cpu_experimental_ynn_fusion_type=+eltwise",
  "ynn_reduce": "--xla_cpu_experimental_ynn_fusion_type=+reduce",
  "onednn_dot": "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_onednn=true "
                "--xla_cpu_experimental_onednn_fusion_type=dot",
  "onednn_individual_dot": "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_onednn=true "
                           "--xla_cpu_experimental_onednn_fusion_type=individual_dot",
  "vector512": "--xla_cpu_prefer_vector_width=512",
  "vector128": "--xla_cpu_prefer_vector_width=128",
}
IN, H, OUT = 784, 1024, 10
# name: (what it is, lhs shape, rhs shape, lhs contracting dim, rhs contracting dim); B stands for the batch.
DOTS = {
  "nn_x_w1": ("fwd layer 1: x @ W1", ("B", IN), (IN, H), 1, 0),
  "nn_h_w2": ("fwd layer 2: h1 @ W2", ("B", H), (H, H), 1, 0),
  "nn_h_w3": ("fwd head: h2 @ W3", ("B", H), (H, OUT), 1, 0),
  "nt_g3_w3": ("bwd dh2 = dlogits @ W3^T", ("B", OUT), (H, OUT), 1, 1),
  "nt_g_w2": ("bwd dh1 = dh2 @ W2^T", ("B", H), (H, H), 1, 1),
  "tn_h_g3": ("bwd dW3 = h2^T @ dlogits", ("B", H), ("B", OUT), 0, 0),
  "tn_h_g": ("bwd dW2 = h1^T @ dh2", ("B", H), ("B", H), 0, 0),
  "tn_x_g": ("bwd dW1 = x^T @ dh1", ("B", IN), ("B", H), 0, 0),
  "nnc_h_g": ("bwd dW2 as dense_dot's: copy h1^T, then NN", ("B", H), ("B", H), 0, 0),
  "nnc_x_g": ("bwd dW1 as dense_dot's: copy x^T, then NN", ("B", IN), ("B", H), 0, 0),
}
COPY_FIRST = ("nnc_h_g", "nnc_x_g")  # JAX: the lhs transposed behind a barrier, as dense_dot's backward does.
LAX = "+lax"  # A set name's suffix: the MLP's Linears on lax.dot_general (the model before dense_dot).
WHOLE = {"fwd_bwd": "loss and grads (jax.value_and_grad; torch: forward + backward)",
         "adam": "Adam update of every parameter (optax.adam + apply_updates; torch.optim.Adam.step)",
         "step": "the whole train step: grads + Adam"}
PARTS = (*DOTS, *WHOLE)
REPS = 5  # Timed calls per part, set and round.


def _isa() -> str:
  """The CPU's vector extensions that matter to these kernels (as four_way.isa says them)."""
  with open("/proc/cpuinfo") as f:
    flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
  return ", ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags) or "none listed"


def _shape(dims: tuple, batch: int) -> tuple[int, ...]:
  return tuple(batch if d == "B" else d for d in dims)


def _flops(part: str, batch: int) -> float:
  """Multiply-adds x 2 of a dot part."""
  _, lhs, rhs, lc, rc = DOTS[part]
  lhs, rhs = _shape(lhs, batch), _shape(rhs, batch)
  return 2.0 * lhs[0] * lhs[1] * rhs[1 - rc]


def options_of(name: str) -> dict[str, object]:
  """The compiler options of set `name` (SET or SET+lax)."""
  return SETS[name.removesuffix(LAX)]


def jax_parts(options: dict[str, object], batch: int, parts: list[str],
              lax_dot: bool = False) -> dict[str, Callable[[], None]]:
  """Each part compiled with `options` as a call that runs it once and waits (`lax_dot`: the MLP without dense_dot)."""
  with _mlp_dot(lax_dot):
    return _jax_parts(options, batch, parts)


@contextlib.contextmanager
def _mlp_dot(lax_dot: bool) -> Iterator[None]:
  """With `lax_dot`, jaxdp's MLP builds its Linears on lax.dot_general (as before dense_dot) inside the block."""
  import jax
  from jaxdp.models import mlp
  if not lax_dot:
    yield
    return
  saved, mlp.dense_dot = mlp.dense_dot, jax.lax.dot_general
  try:
    yield
  finally:
    mlp.dense_dot = saved


def _jax_parts(options: dict[str, object], batch: int, parts: list[str]) -> dict[str, Callable[[], None]]:
  import jax
  import ml_collections
  import numpy as np
  import optax
  from jaxdp import models
  rng = np.random.default_rng(0)
  out: dict[str, Callable[[], None]] = {}
  for part in parts:
    if part not in DOTS:
      continue
    _, lhs, rhs, lc, rc = DOTS[part]
    a = jax.device_put(rng.standard_normal(_shape(lhs, batch), dtype=np.float32))
    b = jax.device_put(rng.standard_normal(_shape(rhs, batch), dtype=np.float32))
    dims = (((lc,), (rc,)), ((), ()))
    if part in COPY_FIRST:
      fn = lambda a, b: jax.lax.optimization_barrier(a.T) @ b  # noqa: E731
    else:
      fn = lambda a, b, dims=dims: jax.lax.dot_general(a, b, dims)  # noqa: E731
    f = jax.jit(fn).lower(a, b).compile(compiler_options=options)
    out[part] = lambda f=f, a=a, b=b: f(a, b).block_until_ready()
  if not set(parts) & set(WHOLE):
    return out
  model = models.get_model(ml_collections.ConfigDict({"name": "mlp", "hidden": (H, H)}), (IN,), OUT)
  params, model_state = model.init(jax.random.PRNGKey(0))
  tx = optax.adam(1e-3)
  x = jax.device_put(rng.random((batch, IN), dtype=np.float32))
  y = jax.device_put(np.arange(batch) % OUT)

  def grads(params):
    def loss(p):
      logits, _ = model.apply(p, model_state, x, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return jax.value_and_grad(loss)(params)

  def adam(params, opt_state, g):
    updates, opt_state = tx.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  def step(params, opt_state):
    value, g = grads(params)
    params, opt_state = adam(params, opt_state, g)
    return params, opt_state, value

  opt_state = tx.init(params)
  g = jax.tree.map(lambda p: p * 1e-3, params)
  state = [jax.tree.map(lambda p: p.copy(), params), tx.init(params)]  # The step donates its own copy.
  if "fwd_bwd" in parts:
    fb = jax.jit(grads).lower(params).compile(compiler_options=options)
    out["fwd_bwd"] = lambda: jax.block_until_ready(fb(params))
  if "adam" in parts:
    ad = jax.jit(adam).lower(params, opt_state, g).compile(compiler_options=options)
    out["adam"] = lambda: jax.block_until_ready(ad(params, opt_state, g))
  if "step" in parts:
    st = jax.jit(step, donate_argnums=(0, 1)).lower(*state).compile(compiler_options=options)

    def run_step() -> None:
      state[0], state[1], value = st(*state)
      value.block_until_ready()
    out["step"] = run_step
  return out


def torch_parts(batch: int, parts: list[str], threads: int) -> dict[str, Callable[[], None]]:
  """The same parts in eager torch (one call each)."""
  import torch
  torch.set_num_threads(threads)
  gen = torch.Generator().manual_seed(0)
  out: dict[str, Callable[[], None]] = {}
  for part in parts:
    if part not in DOTS:
      continue
    _, lhs, rhs, lc, rc = DOTS[part]
    # Stored as JAX stores them; the transposes are views, as in torch's autograd.
    a = torch.randn(_shape(lhs, batch), generator=gen)
    b = torch.randn(_shape(rhs, batch), generator=gen)
    a, b = (a.t() if lc == 0 else a), (b.t() if rc == 1 else b)
    out[part] = lambda a=a, b=b: torch.mm(a, b)
  model = torch.nn.Sequential(torch.nn.Linear(IN, H), torch.nn.ReLU(), torch.nn.Linear(H, H), torch.nn.ReLU(),
                              torch.nn.Linear(H, OUT))
  opt = torch.optim.Adam(model.parameters(), lr=1e-3)
  x, y = torch.rand(batch, IN, generator=gen), torch.arange(batch) % OUT

  def fwd_bwd() -> None:
    model.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()

  def step() -> None:
    fwd_bwd()
    opt.step()
  fwd_bwd()
  opt.step()  # Adam's state exists from here: the timed step is a steady one.
  out.update({"fwd_bwd": fwd_bwd, "adam": opt.step, "step": step})
  return {p: out[p] for p in parts if p in out}


def hlo_summary(options: dict[str, object], batch: int, lax_dot: bool = False) -> str:
  """The optimised HLO of the fwd+bwd: each dot or library fusion with its operands, and the copies and
  transposes around them."""
  with _mlp_dot(lax_dot):
    return _hlo_summary(options, batch)


def _hlo_summary(options: dict[str, object], batch: int) -> str:
  import jax
  import ml_collections
  import numpy as np
  import optax
  from jaxdp import models
  model = models.get_model(ml_collections.ConfigDict({"name": "mlp", "hidden": (H, H)}), (IN,), OUT)
  params, model_state = model.init(jax.random.PRNGKey(0))
  x = np.zeros((batch, IN), np.float32)
  y = np.zeros((batch,), np.int32)

  def loss(p):
    logits, _ = model.apply(p, model_state, x, train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  text = jax.jit(jax.value_and_grad(loss)).lower(params).compile(compiler_options=options).as_text()
  keep = re.compile(r"\b(dot|copy|transpose)\(|__\w+_fusion|kind=k")
  lines = [re.sub(r", metadata=\{[^}]*\}", "", line.strip()) for line in text.splitlines() if keep.search(line)]
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--sets", default=",".join(SETS))
  parser.add_argument("--parts", default=",".join(PARTS))
  parser.add_argument("--cores", type=int, default=1, help="Cores (and so XLA and torch threads) for this process.")
  parser.add_argument("--batch", type=int, default=512, help="Rows per step (one of 2 processes' share of 1024).")
  parser.add_argument("--torch", action=argparse.BooleanOptionalAction, default=True)
  parser.add_argument("--hlo", default="", help="Print the fwd+bwd's optimised HLO under this set, and exit.")
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  if hasattr(os, "sched_setaffinity"):  # Before JAX starts: XLA sizes its thread pool from the affinity.
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[-args.cores:])
  if args.hlo:
    print(hlo_summary(options_of(args.hlo), args.batch, args.hlo.endswith(LAX)))
    return
  sets, parts = args.sets.split(","), args.parts.split(",")
  start, load0 = time.time(), abrun.load()
  calls = {s: jax_parts(options_of(s), args.batch, parts, s.endswith(LAX)) for s in sets}
  if args.torch:
    calls["torch"] = torch_parts(args.batch, parts, args.cores)
  names = list(calls)
  times: dict[str, dict[str, list[float]]] = {n: {p: [] for p in parts} for n in names}
  per_round: dict[str, dict[str, list[float]]] = {n: {p: [] for p in parts} for n in names}
  for n in names:  # Warm-up: first calls allocate and page in.
    for p in parts:
      for _ in range(2):
        calls[n][p]()
  loads = []
  for r in range(args.rounds):
    loads.append(abrun.load())
    for p in parts:
      for n in (names if r % 2 == 0 else names[::-1]):
        ts = []
        for _ in range(REPS):
          t = time.perf_counter()
          calls[n][p]()
          ts.append(time.perf_counter() - t)
        times[n][p] += ts
        per_round[n][p].append(min(ts))
    print(f"round {r + 1}/{args.rounds} load {loads[-1]:.1f}", file=sys.stderr, flush=True)
  report = render(args, names, parts, times, per_round, start, load0, loads)
  print(report)
  if args.out:
    with open(args.out, "a") as f:
      f.write(report + "\n")


def render(args: argparse.Namespace, names: list[str], parts: list[str], times: dict, per_round: dict,
           start: float, load0: float, loads: list[float]) -> str:
  """The tables: ms per call (median, min) per part and set; ratios per round against the defaults."""
  import jax
  import torch
  lines = [f"## {time.strftime('%Y-%m-%d %H:%M', time.gmtime(start))} UTC: `python experiments/dense_parts.py "
           f"{' '.join(sys.argv[1:])}`", "",
           f"- machine: {abrun.cpu_model()} ({platform.machine()}), {os.cpu_count()} cores, this process on "
           f"{args.cores}; ISA: {_isa()}",
           f"- jax {jax.__version__}, torch {torch.__version__}; batch {args.batch}; {args.rounds} rounds x {REPS} "
           f"calls per part and set; load {load0:.1f} at the start, {min(loads):.1f}..{max(loads):.1f} during, "
           f"{abrun.load():.1f} at the end; {time.time() - start:.0f} s", "",
           "ms per call: median [min] over all calls; then the per-round ratio of mins to `defaults`, median "
           "(min..max), < 1 faster; dots also in GFLOP/s from the min.", "",
           "| part | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
  for p in parts:
    cells = []
    for n in names:
      med, low = 1e3 * statistics.median(times[n][p]), 1e3 * min(times[n][p])
      cell = f"{med:.2f} [{low:.2f}]"
      if p in DOTS:
        cell += f" {_flops(p, args.batch) / low / 1e6:.0f} GF/s"
      if n != "defaults" and "defaults" in names:
        ratios = [a / b for a, b in zip(per_round[n][p], per_round["defaults"][p])]
        cell += f"; **{statistics.median(ratios):.3g}** ({min(ratios):.3g}..{max(ratios):.3g})"
      cells.append(cell)
    what = DOTS[p][0] if p in DOTS else WHOLE[p]
    lines.append(f"| {p}: {what} | " + " | ".join(cells) + " |")
  lines += ["", "Sets: " + "; ".join(f"{n} `{FLAGS_TEXT[n.removesuffix(LAX)]}`" + (" (lax.dot_general)" if n.endswith(LAX)
                                     else "") for n in names if n.removesuffix(LAX) in FLAGS_TEXT), ""]
  return "\n".join(lines)


if __name__ == "__main__":
  main()
