"""`python -m jaxdp.sample --workdir DIR`: text from a byte-level language model (`generate`, `sample_text`)."""

import argparse
import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxdp.config import ConfigError
from jaxdp.runtime import exits
from jaxdp.tools import cli, restore

if TYPE_CHECKING:  # Annotations only: JAX, the models and the text dataset load after `--help` is answered.
  import jax

  from jaxdp.models import Model

USAGE = ("python -m jaxdp.sample --workdir DIR [--config CONFIG.py] [--config.key=value ...] [--prompt TEXT] "
         "[--num_chars N] [--temperature T] [--seed S] [--step N]")
EXTRA_HELP = ("  --prompt, --num_chars, --temperature, --seed: what to sample (defaults: newline, 500, 0.8, 0).\n"
              "  --step: the checkpoint to sample from (default: the newest).\n"
              "  --config is optional: the checkpoint's stored config is the default.")
PyTree = Any


def generate(model: "Model", params: PyTree, model_state: PyTree, prompt_tokens: np.ndarray, num_tokens: int,
             rng: "jax.Array", temperature: float = 1.0, *, seq_len: int) -> np.ndarray:
  """`num_tokens` ids after `prompt_tokens` (non-empty), each from the last `seq_len`: greedy at temperature 0."""
  import jax.numpy as jnp
  prompt = np.asarray(prompt_tokens, np.int32).reshape(-1)
  if prompt.size == 0:
    raise ValueError("the prompt needs at least one token")
  if num_tokens <= 0:
    return np.zeros((0,), np.int32)
  total = prompt.size + num_tokens
  tokens = jnp.zeros((max(total, seq_len),), jnp.int32).at[:prompt.size].set(prompt)
  out = _compiled()(model, seq_len, params, model_state, tokens, prompt.size, total, rng, jnp.float32(temperature))
  return np.asarray(out[prompt.size:total])


@functools.cache
def _compiled() -> Callable:
  """`_generate` under `jax.jit` (the model and `seq_len` static), made once at the first sample."""
  import jax
  return jax.jit(_generate, static_argnums=(0, 1))


def _generate(model: "Model", seq_len: int, params: PyTree, model_state: PyTree, tokens: "jax.Array",
              start: "jax.Array", total: "jax.Array", rng: "jax.Array", temperature: "jax.Array") -> "jax.Array":
  """Fills tokens[start:total] one at a time; each step reads a window of `seq_len` ending at cur - 1."""
  import jax
  import jax.numpy as jnp

  def body(cur: "jax.Array", tokens: "jax.Array") -> "jax.Array":
    first = jnp.maximum(cur - seq_len, 0)
    window = jax.lax.dynamic_slice(tokens, (first,), (seq_len,))  # Causal: what follows cur - 1 is ignored.
    logits, _ = model.apply(params, model_state, window[None].astype(jnp.float32), train=False)
    logits = logits[0, cur - 1 - first].astype(jnp.float32)
    sampled = jax.random.categorical(jax.random.fold_in(rng, cur), logits / jnp.maximum(temperature, 1e-6))
    token = jnp.where(temperature > 0, sampled, jnp.argmax(logits))
    return tokens.at[cur].set(token.astype(jnp.int32))

  return jax.lax.fori_loop(start, total, body, tokens)


def sample_text(model: "Model", params: PyTree, model_state: PyTree, prompt: str, num_chars: int, *, seq_len: int,
                seed: int = 0, temperature: float = 0.8) -> str:
  """`prompt` followed by `num_chars` sampled bytes, decoded as UTF-8 (a cut multi-byte character: U+FFFD)."""
  import jax

  from jaxdp.datasets.text_file import decode, encode
  tokens = generate(model, params, model_state, encode(prompt), num_chars, jax.random.PRNGKey(seed), temperature,
                    seq_len=seq_len)
  return prompt + decode(tokens)


def load_model(config: Any, workdir: str, step: int | None = None, *, language_model: bool = False,
               model: Any = None, task: Any = None, eval_data: Any = None) -> tuple["Model", PyTree, PyTree, int]:
  """(model, params, model state, seq_len) of WORKDIR's checkpoint `step` (default: newest), as `restore.restore`."""
  from jaxdp import checkpoint  # orbax and the input pipeline: only a restore needs them.
  from jaxdp.datasets.text_file import VOCAB_SIZE
  parts, state, step = restore.restore(config, workdir, step, "jaxdp.sample.load_model", model=model, task=task,
                                       eval_data=eval_data)
  ds = parts.ds
  if language_model and not (ds.integer_inputs and tuple(ds.label_shape) == tuple(ds.input_shape)
                             and ds.num_classes == VOCAB_SIZE):  # Not byte-level next-token text (`gpt`).
    raise ConfigError(f"the checkpoint in {workdir!r} is model {config.model.get('name', '?')!r} on {ds.name!r} (input "
                      f"{tuple(ds.input_shape)}, {ds.num_classes} classes), not a byte-level language model: "
                      f"jaxdp.sample needs a run of the gpt workload (next-token labels over {VOCAB_SIZE} byte "
                      f"tokens, e.g. --config jaxdp/configs/gpt_tiny_shakespeare.py)")
  # stderr: stdout carries only the sampled text.
  print(f"sampling from checkpoint {checkpoint.directory(workdir)}/{step}", file=sys.stderr)
  return parts.model, parts.backend.get(state.params), parts.backend.get(state.model_state), ds.input_shape[0]


def main(argv: list[str]) -> int:
  """Prints `prompt` and its continuation; returns the exit status (2 for a config mistake)."""
  cli.start(argv, USAGE, EXTRA_HELP)  # Before JAX and TensorFlow load: `--help` answers at once.
  return cli.workdir_tool(argv, usage=USAGE, extra_help=EXTRA_HELP, flags=_sample_flags, command=_sample_command)


def _sample_flags(parser: argparse.ArgumentParser) -> None:
  for flag, kind, default in (("--prompt", str, "\n"), ("--num_chars", int, 500), ("--temperature", float, 0.8),
                              ("--seed", int, 0)):
    parser.add_argument(flag, type=kind, default=default)


def _sample_command(ours: argparse.Namespace, config: Any, workdir: str) -> None:
  """Restores the checkpoint and prints the prompt with its sampled continuation."""
  if not ours.prompt:
    raise ConfigError("--prompt must not be empty")
  model, params, model_state, seq_len = load_model(config, workdir, ours.step, language_model=True)
  print(sample_text(model, params, model_state, ours.prompt, ours.num_chars, seq_len=seq_len, seed=ours.seed,
                    temperature=ours.temperature))


if __name__ == "__main__":
  exits.exit(main(sys.argv))
