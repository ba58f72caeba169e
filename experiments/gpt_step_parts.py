"""The small GPT's train step in parts, XLA:CPU (jit) against eager PyTorch, at the four-way study's shapes.

    python experiments/gpt_step_parts.py [--rounds 7] [--repeats 20] [--parts embed,attention,...]
    python experiments/gpt_step_parts.py --parts step --baseline_rev HEAD~1   # whole step: this gpt.py vs an older one
    python experiments/gpt_step_parts.py --parts none --dump /tmp/gpt_hlo      # the whole step's optimized HLO

experiments/four_way_configs.py's "gpt": 4 layers, 4 heads, width 128, rotary, vocabulary 256, context 64,
batch 12, AdamW with clip 1.0. Each part runs forward and backward at the step's shapes (jax: `jax.grad` of
<output, fixed cotangent> jitted, waited for with block_until_ready; torch: the same function, `.backward` with
the same cotangent), with each side's default threads (XLA's Eigen pool, torch's intra-op threads: both 2 here).
Several JAX formulations of a part are timed next to each other (the first is what jaxdp.models.gpt computed
before experiments/gpt_step_parts.md's changes, `now` calls jaxdp.models.gpt's own function where it has one).
Rounds alternate the contenders (abrun.alternate: A B C A B C ...); prints per contender the median over rounds
of per-round median ms, with (min..max) over rounds, the overall fastest call, and the per-round ratio of the
part's first contender to each (> 1: faster than the first).

`step` is the whole train step: jaxdp's GPT (models.get_model) through experiments/four_way_jax.py's jit step
(value_and_grad, optax clip + AdamW, state donated) against experiments/four_way_torch.py's eager step; with
--baseline_rev REV also the same jit step on `git show REV:jaxdp/models/gpt.py`, for A/B of a model change.
"""

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402

B, T, D, H, VOCAB, MLP = 12, 64, 128, 4, 256, 4
PARTS = ("embed", "attention", "rotary", "layernorm", "gelu", "mlp", "head_ce", "adamw", "step")


def _jax_grad(fn: Callable, *args: object, argnums: tuple[int, ...]) -> Callable[[], object]:
  """A no-argument call of jit(grad(<fn(*args), fixed cotangent>)) w.r.t. `argnums`, waited for."""
  import jax
  out = jax.eval_shape(fn, *args)
  cot = jax.random.normal(jax.random.PRNGKey(9), out.shape, out.dtype)
  g = jax.jit(jax.grad(lambda *a: (fn(*a) * cot).sum(), argnums=argnums))
  return lambda: jax.block_until_ready(g(*args))


def _torch_grad(fn: Callable, *args: "object") -> Callable[[], None]:
  """A no-argument call of fn(*args).backward(fixed cotangent); float tensors among args need gradients."""
  import torch
  leaves = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
  for a in leaves:
    a.requires_grad_(True)
  cot = torch.randn(fn(*args).shape)

  def run() -> None:
    for a in leaves:
      a.grad = None
    fn(*args).backward(cot)
  return run


def jax_parts(part: str) -> dict[str, Callable[[], object]]:
  """Contender name -> a no-argument call of part `part` in JAX (several formulations)."""
  import jax
  import jax.numpy as jnp
  from jaxdp.models import gpt
  key = jax.random.split(jax.random.PRNGKey(0), 8)
  hd = D // H
  if part == "embed":
    table = jax.random.normal(key[0], (VOCAB, D)) * 0.02
    tokens = jax.random.randint(key[1], (B, T), 0, VOCAB)
    return {"take (gather, scatter-add grad)": _jax_grad(lambda w, i: jnp.take(w, i, axis=0), table, tokens,
                                                         argnums=(0,)),
            "one-hot @ table": _jax_grad(lambda w, i: jax.nn.one_hot(i, VOCAB, dtype=w.dtype) @ w, table, tokens,
                                         argnums=(0,)),
            **({"now": _jax_grad(gpt.embed_tokens, table, tokens, argnums=(0,))} if hasattr(gpt, "embed_tokens") else {})}
  if part == "attention":
    q, k, v = (jax.random.normal(key[i], (B, T, H, hd)) for i in range(3))

    def einsum_softmax(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
      s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd)
      s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -1e30)
      return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    return {"jax.nn.dot_product_attention": _jax_grad(lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, is_causal=True), q, k, v, argnums=(0, 1, 2)),
            "einsum + mask + softmax": _jax_grad(einsum_softmax, q, k, v, argnums=(0, 1, 2)),
            **({"now": _jax_grad(gpt.causal_attention, q, k, v, argnums=(0, 1, 2))}
               if hasattr(gpt, "causal_attention") else {})}
  if part == "rotary":
    x = jax.random.normal(key[0], (B, T, 2 * H, hd))  # q and k together.

    def split_concat(x: jax.Array, base: float = 10000.0) -> jax.Array:
      t, dim = x.shape[1], x.shape[-1]
      freqs = base ** (-jnp.arange(0, dim // 2, dtype=jnp.float32) * 2 / dim)
      angles = jnp.arange(t, dtype=jnp.float32)[:, None] * freqs[None, :]
      cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
      x1, x2 = jnp.split(x, 2, axis=-1)
      return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return {"split + concatenate": _jax_grad(split_concat, x, argnums=(0,)),
            "now": _jax_grad(gpt.rotary, x, argnums=(0,))}
  if part == "layernorm":
    from flax import nnx
    ln = nnx.LayerNorm(D, rngs=nnx.Rngs(0))
    graph, params = nnx.split(ln)
    x = jax.random.normal(key[0], (B, T, D))
    return {"nnx.LayerNorm": _jax_grad(lambda p, x: nnx.merge(graph, p)(x), params, x, argnums=(0, 1))}
  if part == "gelu":
    x = jax.random.normal(key[0], (B, T, MLP * D))
    return {"nnx.gelu (tanh)": _jax_grad(jax.nn.gelu, x, argnums=(0,))}
  if part == "mlp":
    w1, w2 = jax.random.normal(key[0], (D, MLP * D)) * 0.02, jax.random.normal(key[1], (MLP * D, D)) * 0.02
    b1, b2 = jnp.zeros(MLP * D), jnp.zeros(D)
    x = jax.random.normal(key[2], (B, T, D))
    return {"fc gelu proj": _jax_grad(lambda w1, b1, w2, b2, x: jax.nn.gelu(x @ w1 + b1) @ w2 + b2,
                                      w1, b1, w2, b2, x, argnums=(0, 1, 2, 3, 4))}
  if part == "head_ce":
    import optax
    w, b = jax.random.normal(key[0], (D, VOCAB)) * 0.02, jnp.zeros(VOCAB)
    x = jax.random.normal(key[1], (B, T, D))
    labels = jax.random.randint(key[2], (B, T), 0, VOCAB)
    ce = lambda w, b, x: optax.softmax_cross_entropy_with_integer_labels(x @ w + b, labels).mean()  # noqa: E731
    g = jax.jit(jax.grad(ce, argnums=(0, 1, 2)))
    return {"head + optax CE": lambda: jax.block_until_ready(g(w, b, x))}
  if part == "adamw":
    import four_way_configs
    import four_way_jax
    model, _ = _jax_model(gpt.GPT)
    params, _ = model.init(jax.random.PRNGKey(0))
    config = four_way_configs.get_config("gpt")
    config.num_train_steps = 400
    tx = four_way_jax.tx_of(config)
    grads = jax.tree.map(lambda p: p * 0.01, params)
    update = jax.jit(lambda g, s, p: tx.update(g, s, p), donate_argnums=1)
    state = [tx.init(params)]

    def run() -> None:
      updates, state[0] = update(grads, state[0], params)
      jax.block_until_ready(updates)
    return {"optax clip + adamw": run}
  if part == "step":
    return {}  # Built by whole_steps (it needs the baseline model too).
  raise ValueError(part)


def torch_parts(part: str) -> dict[str, Callable[[], object]]:
  """Contender name -> a no-argument call of part `part` in eager torch, the torch twin's formulation."""
  import torch
  import torch.nn.functional as F
  import four_way_torch
  torch.manual_seed(0)
  hd = D // H
  if part == "embed":
    table, tokens = torch.randn(VOCAB, D) * 0.02, torch.randint(0, VOCAB, (B, T))
    return {"torch F.embedding": _torch_grad(F.embedding, tokens, table)}
  if part == "attention":
    q, k, v = (torch.randn(B, T, H, hd) for _ in range(3))
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(  # noqa: E731
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    return {"torch sdpa": _torch_grad(sdpa, q, k, v)}
  if part == "rotary":
    return {"torch cat": _torch_grad(four_way_torch.rotary, torch.randn(B, T, 2 * H, hd))}
  if part == "layernorm":
    ln = torch.nn.LayerNorm(D, eps=1e-6)
    return {"torch LayerNorm": _torch_grad(ln, torch.randn(B, T, D))}
  if part == "gelu":
    return {"torch gelu (tanh)": _torch_grad(lambda x: F.gelu(x, approximate="tanh"), torch.randn(B, T, MLP * D))}
  if part == "mlp":
    fc, proj = torch.nn.Linear(D, MLP * D), torch.nn.Linear(MLP * D, D)
    return {"torch fc gelu proj": _torch_grad(lambda x: proj(F.gelu(fc(x), approximate="tanh")),
                                              torch.randn(B, T, D))}
  if part == "head_ce":
    head, x, labels = torch.nn.Linear(D, VOCAB), torch.randn(B, T, D, requires_grad=True), torch.randint(0, VOCAB, (B, T))

    def run() -> None:
      head.zero_grad(set_to_none=True)
      x.grad = None
      F.cross_entropy(head(x).reshape(-1, VOCAB), labels.reshape(-1)).backward()
    return {"torch head + CE": run}
  if part == "adamw":
    net, opt, _ = _torch_model()
    for p in net.parameters():
      p.grad = p.detach() * 0.01

    def run() -> None:
      torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
      opt.step()
    return {"torch clip + AdamW": run}
  return {}


def _jax_model(cls: type) -> tuple[object, object]:
  """(jaxdp Model of GPT class `cls` at the workload's config, the config)."""
  import four_way_configs
  from jaxdp import models
  config = four_way_configs.get_config("gpt")
  config.num_train_steps = 400
  return models.get_model(config.model, (T,), VOCAB, module=cls), config


def _torch_model() -> tuple[object, object, object]:
  """(four_way_torch's GPT, its AdamW, its schedule) at the workload's config."""
  import four_way_configs
  import four_way_torch
  import torch
  config = four_way_configs.get_config("gpt")
  config.num_train_steps = 400
  torch.manual_seed(0)
  net = four_way_torch.make_model("gpt", config, (T,), VOCAB)
  opt, schedule = four_way_torch.optimizer(config, net)
  return net, opt, schedule


def jax_step(cls: type) -> tuple[Callable[[], object], Callable]:
  """(a no-argument call of four_way_jax's jit train step on GPT class `cls`, the jitted step)."""
  import jax
  import jax.numpy as jnp
  import optax
  import four_way_jax
  model, config = _jax_model(cls)
  tx = four_way_jax.tx_of(config)

  loss_fn = four_way_jax.loss_of(model)

  def step(state, inputs, labels):
    params, model_state, opt_state = state
    (loss, model_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, model_state, inputs, labels)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), model_state, opt_state), loss

  params, model_state = model.init(jax.random.PRNGKey(0))
  state = [(params, model_state, tx.init(params))]
  step_fn = jax.jit(step, donate_argnums=0)
  rng = np.random.default_rng(0)
  inputs = jnp.asarray(rng.integers(0, VOCAB, (B, T)).astype(np.float32))  # The pipeline hands over float32.
  labels = jnp.asarray(rng.integers(0, VOCAB, (B, T)).astype(np.int32))

  def run() -> None:
    state[0], loss = step_fn(state[0], inputs, labels)
    loss.block_until_ready()
  return run, lambda: step_fn.lower(state[0], inputs, labels)


def torch_step() -> Callable[[], None]:
  """A no-argument call of four_way_torch's eager train step (zero_grad, forward, CE, backward, clip, AdamW)."""
  import torch
  import torch.nn.functional as F
  net, opt, schedule = _torch_model()
  rng = np.random.default_rng(0)
  inputs = torch.from_numpy(rng.integers(0, VOCAB, (B, T)))
  labels = torch.from_numpy(rng.integers(0, VOCAB, (B, T)))

  def run() -> None:
    opt.zero_grad(set_to_none=True)
    logits = net(inputs)
    F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1)).backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    schedule.step()
  return run


def baseline_gpt(rev: str) -> type:
  """The GPT class of jaxdp/models/gpt.py at git revision `rev`."""
  return abrun.module_at(rev, "jaxdp/models/gpt.py", "gpt_baseline").GPT


def measure(calls: dict[str, Callable[[], object]], rounds: int, repeats: int,
            clock: Callable[[], float] = time.perf_counter) -> list[str]:
  """Markdown rows: contender | median (min..max) over rounds of per-round median ms | fastest call ms."""
  fastest = {name: float("inf") for name in calls}

  def timed(name: str, call: Callable[[], object]) -> abrun.Contender:
    def run(n: int) -> list[float]:
      times = abrun.time_steps(call, n, lambda _: None, clock)
      fastest[name] = min(fastest[name], *times)
      return times
    return run
  medians = abrun.alternate({name: timed(name, call) for name, call in calls.items()}, rounds, repeats)
  first = next(iter(calls))
  return [f"| {name} | {abrun.fmt([m * 1e3 for m in medians[name]])} | {fastest[name] * 1e3:.3g} | "
          f"{abrun.fmt(abrun.ratios(medians[first], medians[name]))} |" for name in calls]


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--repeats", type=int, default=20, help="Timed calls per contender per round.")
  parser.add_argument("--parts", default=",".join(PARTS), help=f"Comma-separated, of {', '.join(PARTS)}; or none.")
  parser.add_argument("--baseline_rev", default="", help="With part step: also time gpt.py at this git revision.")
  parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                      help="cpu: the process's CPU seconds (all threads), far less disturbed by other jobs on a "
                           "shared machine; compares contenders of one runtime (jax against jax), not jax and torch.")
  parser.add_argument("--no_torch", action="store_true", help="Time the JAX contenders only.")
  parser.add_argument("--dump", default="", help="Write the whole jit step's optimized HLO to this directory.")
  args = parser.parse_args(argv)
  import jax
  import torch
  from jaxdp.models import gpt
  print(f"load: {os.getloadavg()}; torch threads {torch.get_num_threads()}; jax {jax.__version__}, "
        f"torch {torch.__version__}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
  if args.dump:
    os.makedirs(args.dump, exist_ok=True)
    _, lower = jax_step(gpt.GPT)
    with open(os.path.join(args.dump, "step.hlo.txt"), "w") as f:
      f.write(lower().compile().as_text())
    print(f"wrote {args.dump}/step.hlo.txt")
  print(f"clock: {args.clock}")
  print("| part: contender | ms per call fwd+bwd: median (min..max) over rounds | fastest call ms "
        "| the part's first contender / this, per round |\n|---|---|---|---|")
  for part in [p for p in args.parts.split(",") if p and p != "none"]:
    if part == "step":
      calls = {"jax step (this gpt.py)": jax_step(gpt.GPT)[0], **({} if args.no_torch else {"torch step": torch_step()})}
      if args.baseline_rev:
        calls = {f"jax step (gpt.py at {args.baseline_rev})": jax_step(baseline_gpt(args.baseline_rev))[0], **calls}
    else:
      calls = {**jax_parts(part), **({} if args.no_torch else torch_parts(part))}
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    for row in measure(calls, args.rounds, args.repeats, clock):
      print(row.replace("| ", f"| {part}: ", 1), flush=True)
  print(f"load after: {os.getloadavg()}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
