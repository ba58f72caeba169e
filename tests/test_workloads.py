"""Workloads: ResNet (synced BatchNorm) on CIFAR-10, GPT on text_file and tiny_shakespeare, sampling, lr scaling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds
from pydoc_data import topics

import runs

from jaxdp import config as config_lib
from jaxdp.report import metrics
from jaxdp import models, optim, train
from jaxdp.tools import sample
from jaxdp import step as step_lib
from jaxdp.tasks.classification import cross_entropy
from jaxdp.configs import cifar10_resnet18, gpt_text_file, gpt_tiny_shakespeare
from jaxdp.datasets import text_file, tiny_shakespeare_chars


@pytest.fixture(scope="module")
def text_path(tmp_path_factory: pytest.TempPathFactory) -> str:
  """About 24 kB of real English: the start of Python's bundled documentation topics."""
  text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))[:24_000]
  path = tmp_path_factory.mktemp("text") / "docs.txt"
  path.write_text(text, encoding="utf-8")
  return str(path)


def _fast(config):
  """No periodic checkpoints: they write files that these tests don't need."""
  config.checkpoint_every_steps = 0
  return config


def _tiny_gpt(config, **model):
  config.model.update(dict(num_layers=1, num_heads=2, embed_dim=32, mlp_ratio=2, **model))
  return _fast(config)


# The cosine schedule.

def test_cosine_warms_up_to_the_learning_rate_and_decays_to_zero_at_the_end(config):
  config.learning_rate, config.batch_size, config.warmup_steps = 0.4, 512, 10
  config.lr_schedule = "cosine"
  assert float(optim.schedule(config)(10)) == pytest.approx(0.4)
  assert float(optim.schedule(config)(5)) == pytest.approx(0.2)
  config.num_train_steps = 100
  assert float(optim.schedule(config)(100)) == 0.0 < float(optim.schedule(config)(99))  # Cosine: 0 at the end.


# text_file dataset.

def test_text_file_windows_are_next_token_pairs_over_a_held_out_tail(text_path, tmp_path):
  raw = open(text_path, "rb").read()
  builder = tfds.builder("text_file", data_dir=str(tmp_path), path=text_path, seq_len=50, stride=25)
  builder.download_and_prepare()
  cut = len(raw) - round(len(raw) * 0.1)
  splits = builder.info.splits
  assert splits["train"].num_examples == len(range(0, cut - 50, 25))
  assert splits["test"].num_examples == len(range(0, len(raw) - cut - 50, 50))  # Eval windows never overlap.
  test = list(tfds.as_numpy(builder.as_dataset(split="test", as_supervised=True)))
  starts = range(0, len(raw) - cut - 50, 50)
  assert {text_file.decode(x) for x, _ in test} == {raw[cut + s:cut + s + 50].decode() for s in starts}
  for x, y in test:
    np.testing.assert_array_equal(x[1:], y[:-1])
  other = tfds.builder("text_file", data_dir=str(tmp_path), path=text_path, seq_len=40)
  assert other.builder_config.name != builder.builder_config.name  # Other windows: never the stale copy.
  strided = tfds.builder("text_file", data_dir=str(tmp_path), path=text_path, seq_len=50, stride=10)
  assert strided.builder_config.name != builder.builder_config.name  # Other train windows too.


def test_text_file_reports_a_bad_path_stride_or_encoding_as_a_config_error(tmp_path):
  with pytest.raises(config_lib.ConfigError, match="needs a path"):
    tfds.builder("text_file", data_dir=str(tmp_path))
  with pytest.raises(config_lib.ConfigError, match="not found"):
    tfds.builder("text_file", data_dir=str(tmp_path), path=str(tmp_path / "missing.txt"))
  (tmp_path / "t.txt").write_text("some text " * 20)
  with pytest.raises(config_lib.ConfigError, match="test_fraction must be in \\(0, 1\\), got '0.1'"):
    tfds.builder("text_file", data_dir=str(tmp_path), path=str(tmp_path / "t.txt"), test_fraction="0.1")
  with pytest.raises(config_lib.ConfigError, match="stride must be a non-negative integer, got -1"):
    tfds.builder("text_file", data_dir=str(tmp_path), path=str(tmp_path / "t.txt"), seq_len=8, stride=-1)
  (tmp_path / "latin1.txt").write_bytes("café ".encode("latin-1") * 20)
  with pytest.raises(config_lib.ConfigError, match="latin1.txt' is not UTF-8"):
    tfds.builder("text_file", data_dir=str(tmp_path), path=str(tmp_path / "latin1.txt"),
                 seq_len=8).download_and_prepare()


def test_encode_decode_round_trip_utf8():
  text = "naïve café → ok"
  tokens = text_file.encode(text)
  assert tokens.max() < text_file.VOCAB_SIZE and len(tokens) == len(text.encode())
  assert text_file.decode(tokens) == text


# Eval per target.

def test_eval_step_averages_over_targets_and_counts_examples():
  logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 4, 5))   # 2 replicas x 3 examples x 4 tokens.
  labels = jax.random.randint(jax.random.PRNGKey(1), (2, 3, 4), 0, 5)
  mask = jnp.array([[True, True, False], [True, False, False]])
  sums = runs.eval_sums(step_lib.CLASSIFICATION, logits, labels, mask)  # The logits are the model's inputs.
  ce = np.asarray(cross_entropy(logits, labels))[np.asarray(mask)]
  assert int(sums["num_examples"]) == 3 and int(sums["weight"]["loss"]) == 12
  summary = metrics.summarize_eval(sums, step_lib.CLASSIFICATION)
  assert summary["eval/loss"] == pytest.approx(ce.mean(), rel=1e-5)
  assert summary["eval/num_examples"] == 3


# GPT.

def _trained(result, config, seq_len):
  """The run's model (as the trainer built it) and its host parameters and state."""
  model = models.get_model(config.model, (seq_len,), text_file.VOCAB_SIZE)
  return model, result.backend.get(result.state.params), result.backend.get(result.state.model_state)


def _assert_causal(model, params, model_state, seq_len):
  """Changing token 9 changes no logits before position 9, and some from 9 on."""
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, seq_len), 0, 256).astype(jnp.float32)
  changed = tokens.at[:, 9].set((tokens[:, 9] + 1) % 256)
  apply = jax.jit(lambda x: model.apply(params, model_state, x, train=False)[0])
  a, b = apply(tokens), apply(changed)
  assert a.shape == (2, seq_len, 256)
  np.testing.assert_array_equal(a[:, :9], b[:, :9])        # The past does not see the future ...
  assert not np.allclose(a[:, 9:], b[:, 9:])               # ... but the present and future see the past.


def test_gpt_text_file_trains_lowers_its_loss_and_samples(text_path, tmp_path, capsys):
  config = _tiny_gpt(gpt_text_file.get_config())
  config.dataset.data_dir = str(tmp_path / "tfds")
  config.dataset.builder_kwargs.update(path=text_path, seq_len=32, stride=16)
  config.batch_size, config.eval_batch_size, config.num_train_steps = 32, 64, 100
  config.log_every_steps, config.eval_every_steps, config.warmup_steps = 10, 100, 5
  config.learning_rate = 1e-2
  config.checkpoint_every_steps = 100  # For the sampling CLI below.
  result = train.train_and_evaluate(config, str(tmp_path / "run"))
  losses = [r["train/loss"] for r in metrics.read(str(tmp_path / "run")) if "train/loss" in r]
  assert losses[0] > 4.0               # Near ln(256) = 5.55 nats: uniform over bytes.
  assert losses[-1] < 0.6 * losses[0]
  # Below what the best context-free guess (the byte frequencies) achieves: it uses the context.
  counts = np.bincount(np.frombuffer(open(text_path, "rb").read(), np.uint8), minlength=256)
  p = counts[counts > 0] / counts.sum()
  assert result.eval_metrics["eval/loss"] < -(p * np.log(p)).sum() - 0.2
  test_bytes = round(len(open(text_path, "rb").read()) * 0.1)
  assert result.eval_metrics["eval/num_examples"] == len(range(0, test_bytes - 32, 32))
  model, params, model_state = _trained(result, config, 32)
  assert config.model.positions == "rotary"
  _assert_causal(model, params, model_state, 32)
  greedy = [sample.sample_text(model, params, model_state, "The ", 40, seq_len=32, temperature=0.0) for _ in (0, 1)]
  assert greedy[0] == greedy[1] and greedy[0].startswith("The ") and len(greedy[0].encode()) <= 44
  # A prompt longer than the context: the model sees the last 32 tokens; same buffer size, no recompile.
  tokens = sample.generate(model, params, model_state, text_file.encode("x" * 34), 10, jax.random.PRNGKey(0),
                           1.0, seq_len=32)
  assert tokens.shape == (10,) and tokens.dtype == np.int32 and tokens.max() < 256
  # The CLI restores the checkpoint (same config and overrides as the run) and continues the same way.
  overrides = {"dataset.data_dir": config.dataset.data_dir, "dataset.builder_kwargs.path": text_path,
               "dataset.builder_kwargs.seq_len": 32, "dataset.builder_kwargs.stride": 16, "model.num_layers": 1,
               "model.num_heads": 2, "model.embed_dim": 32, "model.mlp_ratio": 2}
  argv = ["sample", "--config", gpt_text_file.__file__, "--workdir", str(tmp_path / "run"),
          *[f"--config.{k}={v}" for k, v in overrides.items()], "--prompt=The ", "--num_chars=40", "--temperature=0"]
  capsys.readouterr()
  assert sample.main(argv) == 0
  assert capsys.readouterr().out == greedy[0] + "\n"
  assert sample.main(argv[:3] + ["--workdir", str(tmp_path / "empty")] + argv[5:]) == 2
  assert "no checkpoint" in capsys.readouterr().err


def test_gpt_tiny_shakespeare_two_steps_under_mock_data(tmp_path):
  config = _tiny_gpt(gpt_tiny_shakespeare.get_config())
  config.dataset.data_dir = str(tmp_path)
  config.dataset.builder_kwargs.seq_len = 16
  config.batch_size, config.eval_batch_size, config.num_train_steps = 16, 16, 2
  with tfds.testing.mock_data(num_examples=16):
    result = train.train_and_evaluate(config, str(tmp_path / "run"))
  assert int(result.backend.get(result.state.step)) == 2
  assert result.eval_metrics["eval/num_examples"] == 16
  assert np.isfinite(result.eval_metrics["eval/loss"])
  assert config.model.positions == "learned"
  _assert_causal(*_trained(result, config, 16), 16)


def test_tiny_shakespeare_source_text_under_mock_data(tmp_path):
  with tfds.testing.mock_data(num_examples=3):
    text = tiny_shakespeare_chars.source_text("train", str(tmp_path))
  assert isinstance(text, bytes) and len(text) > 10
  pairs = list(text_file.windows(np.frombuffer(text, np.uint8), 4, 4))
  assert pairs and all((p["inputs"][1:] == p["targets"][:-1]).all() for p in pairs)


# ResNet.

def test_cifar10_resnet18_two_steps_under_mock_data(tmp_path):
  config = cifar10_resnet18.get_config()
  config.dataset.data_dir = str(tmp_path)
  config.model.update(stage_sizes=(1, 1), width=8)  # ResNet-18 cut to 2 stages of 1 block: compiles fast on CPU.
  config.batch_size, config.eval_batch_size, config.num_train_steps = 16, 16, 2
  _fast(config)
  with tfds.testing.mock_data(num_examples=16):
    result = train.train_and_evaluate(config, str(tmp_path / "run"))
  assert int(result.backend.get(result.state.step)) == 2
  assert result.eval_metrics["eval/num_examples"] == 16
  assert np.isfinite(result.eval_metrics["eval/loss"])


@pytest.fixture
def tiny_resnet(config):
  config.model = type(config.model)({"name": "resnet", "stage_sizes": (1,), "width": 4})
  config.num_train_steps, config.log_every_steps, config.learning_rate = 3, 3, 0.05
  config.optimizer, config.optimizer_kwargs.momentum = "sgd", 0.9
  return _fast(config)


def _run(config, workdir, num_devices):
  config.parallel.num_devices = num_devices
  result = train.train_and_evaluate(config, workdir)
  return result.backend.get({"params": result.state.params, "model_state": result.state.model_state})


def test_synced_batchnorm_eight_devices_train_like_one(tiny_resnet, tmp_path):
  one = _run(tiny_resnet, str(tmp_path / "one"), 1)
  eight = _run(tiny_resnet, str(tmp_path / "eight"), 8)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), one, eight)
  tiny_resnet.model.bn_axis_name = None   # Control: per-replica statistics of 4 examples differ from 32.
  local = _run(tiny_resnet, str(tmp_path / "local"), 8)
  assert not np.allclose(local["model_state"]["stem_bn"]["mean"], one["model_state"]["stem_bn"]["mean"], atol=1e-5)
