"""Eval counts every example of the split exactly once, whatever the device count and batch size."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdp import build, data, models, train
from jaxdp.loop import evaluate
from jaxdp.report import metrics
from jaxdp.batch import REAL
from jaxdp.tasks.classification import cross_entropy

SPLIT, SIZE = "test[:101]", 101  # 101 is prime: no batch size below divides it.


@pytest.mark.parametrize("backend, num_devices, eval_batch", [
    ("mesh", 1, 24), ("mesh", 3, 24), ("mesh", 8, 24), ("mesh", 8, 16), ("pmap", 3, 9), ("pmap", 8, 24)])
def test_eval_counts_every_example_once(config, tmp_path, backend, num_devices, eval_batch):
  config.parallel.backend = backend
  config.parallel.num_devices = num_devices
  config.batch_size = 24
  config.eval_batch_size = eval_batch
  config.num_train_steps = 1
  config.dataset.eval_split = SPLIT
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result.eval_metrics["eval/num_examples"] == SIZE
  assert [r for r in metrics.read(str(tmp_path)) if "eval/num_examples" in r][-1]["eval/num_examples"] == SIZE


def test_eval_accuracy_does_not_depend_on_the_device_count(config, tmp_path):
  config.num_train_steps = 10
  config.dataset.eval_split = SPLIT
  config.batch_size = config.eval_batch_size = 24
  results = []
  for n in (1, 3, 8):
    config.parallel.num_devices = n
    results.append(train.train_and_evaluate(config, str(tmp_path / str(n))).eval_metrics)
  assert results[0]["eval/accuracy"] == results[1]["eval/accuracy"] == results[2]["eval/accuracy"]
  assert results[0]["eval/loss"] == pytest.approx(results[2]["eval/loss"], rel=1e-5)


def test_eval_accuracy_counts_only_real_examples(config, tmp_path):
  # 101 examples in batches of 24: 19 padding rows (repeats of real ones) that must not count.
  config.num_train_steps, config.batch_size, config.eval_batch_size = 10, 24, 24
  config.dataset.eval_split = SPLIT
  result = train.train_and_evaluate(config, str(tmp_path))
  params, model_state = result.backend.get((result.state.params, result.state.model_state))
  ds = data.load(config.dataset)
  model = models.get_model(config.model, ds.input_shape, ds.num_classes)
  correct = seen = 0
  for batch in data.eval_batches(ds, SPLIT, global_batch=24, process_index=0, process_count=1):
    logits, _ = model.apply(params, model_state, jnp.asarray(batch["inputs"]), train=False)
    hits = np.argmax(np.asarray(logits), -1) == batch["labels"]
    correct, seen = correct + int(hits[batch[REAL]].sum()), seen + int(batch[REAL].sum())
  assert seen == SIZE
  assert result.eval_metrics["eval/accuracy"] == pytest.approx(correct / SIZE, abs=1e-9)


@pytest.mark.parametrize("invariant", [False, True])
def test_eval_loss_sums_only_real_rows(config, invariant):
  # The last batch of 101 in 24s holds 5 real rows and 19 padding rows (repeats, mask False): their loss
  # must not count, as their accuracy does not.
  config.parallel.invariant, config.batch_size, config.eval_batch_size = invariant, 24, 24
  parts = build.build(config)
  state = parts.backend.init(parts.init)
  *_, last = data.eval_batches(parts.ds, SPLIT, global_batch=24, process_index=0, process_count=1)
  assert int(last[REAL].sum()) == SIZE % 24
  sums = parts.backend.get(parts.eval_step(state, parts.backend.put_batch(last)))
  params, model_state = parts.backend.get((state.params, state.model_state))
  logits, _ = parts.model.apply(params, model_state, jnp.asarray(last["inputs"]), train=False)
  per_row = np.asarray(cross_entropy(logits, jnp.asarray(last["labels"])))
  assert int(sums["weight"]["loss"]) == SIZE % 24
  np.testing.assert_allclose(float(sums["mean"]["loss"]), per_row[last[REAL]].sum(), rtol=1e-5)


def test_eval_runs_the_model_in_eval_mode_so_dropout_is_off(config):
  """An NNX model with dropout: eval must call it with train=False, so its loss and accuracy are the deterministic
  eval-mode ones computed by hand (a train-mode eval fails no shape check: only these numbers show it)."""
  config.model = ml_collections.ConfigDict({"name": "dropout_models:DropoutMLP", "rate": 0.5})
  config.batch_size = config.eval_batch_size = 24
  config.dataset.eval_split = SPLIT
  parts = build.build(config)
  state = parts.backend.init(parts.init)
  got = evaluate.run(parts, state)
  params, model_state = parts.backend.get((state.params, state.model_state))
  rows = list(data.eval_batches(parts.ds, SPLIT, global_batch=24, process_index=0, process_count=1))
  x = jnp.asarray(np.concatenate([b["inputs"][b[REAL]] for b in rows]))
  y = np.concatenate([b["labels"][b[REAL]] for b in rows])
  logits, _ = parts.model.apply(params, model_state, x, train=False)
  assert got["eval/num_examples"] == SIZE
  np.testing.assert_allclose(got["eval/loss"], float(cross_entropy(logits, jnp.asarray(y)).mean()), rtol=1e-5)
  assert got["eval/accuracy"] == pytest.approx(float((np.asarray(logits).argmax(-1) == y).mean()), abs=1e-9)
  trained, _ = parts.model.apply(params, model_state, x, train=True, rng=jax.random.PRNGKey(0))
  assert not np.allclose(logits, trained, rtol=1e-2)  # Dropout does change this model's outputs in train mode.
