"""The task seam (issue 24): user losses and metrics from the CLI, every reduction kind, the same guarantees for
any task (N devices == 1 in invariant mode, ZeRO-1 + accumulation), the built-in regression, best_metric."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

import my_tasks
import runs
from jaxdp import build, checkpoint, data, tasks, train
from jaxdp import config as config_lib
from jaxdp.batch import INDEX, REAL
from jaxdp.config import ConfigError
from jaxdp.configs import default, mlp_digits
from jaxdp.loop import evaluate
from jaxdp.report import metrics, summary
from jaxdp.tasks import base as task_lib
from jaxdp.tasks.classification import cross_entropy

FOCAL = "my_tasks:focal"
USER_METRICS = ("confidence", "worst", "hits", "even_accuracy")


def _cli(tmp_path, data_dir, *overrides) -> list[dict]:
  """`python -m jaxdp.train` in-process on digits; the records of its metrics.jsonl."""
  status = train.main(["jaxdp.train", "--config", mlp_digits.__file__, "--workdir", str(tmp_path),
                       f"--config.dataset.data_dir={data_dir}", "--config.num_train_steps=6",
                       "--config.log_every_steps=1", "--config.eval_every_steps=6", "--config.checkpoint_every_steps=0",
                       "--config.batch_size=64", *overrides])
  assert status == 0
  return metrics.read(str(tmp_path))


def _train(records: list[dict]) -> list[float]:
  return [r["train/loss"] for r in records if "train/loss" in r]


def test_a_user_loss_named_module_function_from_the_cli_changes_the_training(tmp_path, data_dir):
  plain = _cli(tmp_path / "plain", data_dir)
  focal = _cli(tmp_path / "focal", data_dir, f"--config.task.name={FOCAL}")
  as_ce = _cli(tmp_path / "gamma0", data_dir, f"--config.task.name={FOCAL}", "--config.task.gamma=0.0")
  # Focal loss <= cross-entropy, far below it on the first steps; with gamma 0 it is cross-entropy (other arithmetic).
  assert all(f < 0.9 * p for f, p in zip(_train(focal), _train(plain))), (_train(focal), _train(plain))
  np.testing.assert_allclose(_train(as_ce), _train(plain), rtol=2e-4)
  last = {k: v for r in focal for k, v in r.items()}
  for name in USER_METRICS:  # A user metric is train/<name> and eval/<name>; a "_" helper is neither.
    assert f"train/{name}" in last and f"eval/{name}" in last, sorted(last)
  assert "train/accuracy" not in last and "eval/accuracy" not in last  # The classification task did not run.
  assert last["eval/hits"] == int(last["eval/hits"]) and 0 < last["eval/hits"] <= last["eval/num_examples"]
  hits = [r["train/hits"] for r in focal if "train/hits" in r]  # A sum over the 64 rows of a step, not a mean.
  assert len(hits) == 6 and all(h == int(h) and 0 <= h <= 64 for h in hits) and max(hits) > 8, hits


@pytest.mark.parametrize("invariant", [False, True])
def test_each_kind_reduces_eval_rows_as_the_numbers_computed_by_hand(config, invariant):
  """Mean (weighted), sum and max over the real rows of several batches, padding left out (101 = 4 x 24 + 5); the
  invariant mode sums in its own fixed order, and must still take maxima as maxima."""
  config.task.name, config.batch_size, config.eval_batch_size = FOCAL, 24, 24
  config.parallel.invariant = invariant
  config.dataset.eval_split = "test[:101]"
  parts = build.build(config)
  state = parts.backend.init(parts.init)
  got = evaluate.run(parts, state)
  params, model_state = parts.backend.get((state.params, state.model_state))
  rows = [b for b in data.eval_batches(parts.ds, "test[:101]", global_batch=24, process_index=0, process_count=1)]
  x = np.concatenate([b["inputs"][b[REAL]] for b in rows])
  y = np.concatenate([b["labels"][b[REAL]] for b in rows])
  logits = np.asarray(parts.model.apply(params, model_state, jnp.asarray(x), train=False)[0], np.float64)
  log_p = jax.nn.log_softmax(logits)[np.arange(len(y)), y]
  correct = logits.argmax(-1) == y
  even = y % 2 == 0
  assert got["eval/num_examples"] == 101 == len(y)
  np.testing.assert_allclose(got["eval/confidence"], np.exp(log_p).mean(), rtol=1e-5)
  np.testing.assert_allclose(got["eval/worst"], (-log_p).max(), rtol=1e-5)
  assert got["eval/hits"] == correct.sum()
  np.testing.assert_allclose(got["eval/even_accuracy"], correct[even].mean(), rtol=1e-6)


def _dropout_focal(config, num_devices: int, **parallel) -> ml_collections.ConfigDict:
  config.model = ml_collections.ConfigDict({"name": "dropout_models:DropoutMLP"})
  config.task.name, config.num_train_steps, config.batch_size = FOCAL, 4, 32
  config.parallel.num_devices = num_devices
  for k, v in parallel.items():
    config.parallel[k] = v
  return config


def _run(config, workdir) -> tuple[list, dict]:
  result = train.train_and_evaluate(config, str(workdir))
  last = {k: v for r in metrics.read(str(workdir)) for k, v in r.items() if k.split("/")[0] in ("train", "eval")}
  return [np.asarray(x) for x in jax.tree.leaves(result.params)], last


def test_a_user_task_is_bitwise_the_same_on_1_2_4_8_devices_in_invariant_mode(config, tmp_path):
  runs_ = {}
  for n in (1, 2, 4, 8):
    config.grad_accum_steps = 2
    runs_[n] = _run(_dropout_focal(config, n, invariant=True), tmp_path / str(n))
  params1, metrics1 = runs_[1]
  assert set(metrics1) >= {f"train/{k}" for k in USER_METRICS} | {f"eval/{k}" for k in USER_METRICS}
  for n in (2, 4, 8):
    params, got = runs_[n]
    assert all(np.array_equal(a, b) for a, b in zip(params1, params)), n
    assert got == metrics1, (n, {k: (got[k], metrics1[k]) for k in got if got[k] != metrics1.get(k)})


def test_a_user_task_with_zero1_and_accumulation_matches_the_plain_step(config, tmp_path):
  plain = _run(_dropout_focal(config, 8), tmp_path / "plain")
  config.grad_accum_steps = 2
  zero1 = _run(_dropout_focal(config, 8, shard_optimizer_state=True), tmp_path / "zero1")
  # Dropout masks are keyed by micro-batch, so 2 micro-batches of 2 rows draw other masks than 1 of 4: compare
  # accumulation against accumulation without ZeRO-1, and ZeRO-1 without accumulation against plain.
  accum = _run(_dropout_focal(config, 8), tmp_path / "accum")
  config.grad_accum_steps = 1
  zero1_only = _run(_dropout_focal(config, 8, shard_optimizer_state=True), tmp_path / "zero1_only")
  for (pa, ma), (pb, mb) in ((accum, zero1), (plain, zero1_only)):
    for a, b in zip(pa, pb):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for k in ma:
      np.testing.assert_allclose(ma[k], mb[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert any(not np.array_equal(a, b) for a, b in zip(plain[0], accum[0]))  # The masks did differ.


def test_best_metric_may_be_a_user_eval_metric_and_keeps_its_best_checkpoint(tmp_path, data_dir):
  records = _cli(tmp_path, data_dir, f"--config.task.name={FOCAL}", "--config.num_train_steps=8",
                 "--config.eval_every_steps=2", "--config.checkpoint_every_steps=1", "--config.keep_checkpoints=1",
                 "--config.keep_best_checkpoints=1", "--config.best_metric=eval/worst", "--config.best_mode=max")
  worst = {r["step"]: r["eval/worst"] for r in records if "eval/worst" in r}
  best = max(worst, key=worst.get)
  assert best != 8, worst  # Else keeping the newest would pass too.
  assert set(checkpoint.steps(str(tmp_path))) == {best, 8}  # Not the odd steps, saved without eval metrics.


def test_best_metric_not_of_the_task_is_one_config_error_naming_the_choices(config):
  config.task.name, config.keep_best_checkpoints, config.best_metric = FOCAL, 1, "eval/accuracy"
  with pytest.raises(ConfigError, match=r"eval/accuracy.*") as e:
    build.build(config)
  assert "eval/worst" in str(e.value) and "eval/confidence" in str(e.value)
  config.keep_best_checkpoints = 0  # No best checkpoints kept: the default best_metric is never read.
  build.build(config)
  config.keep_best_checkpoints, config.best_metric = 1, "eval/num_examples"  # Every eval's count: never a "best".
  with pytest.raises(ConfigError, match="eval/num_examples"):
    checkpoint.check_best(config, ["eval/loss", "eval/num_examples"])


def test_the_regression_builtin_is_inferred_for_float_labels_and_reports_mse_mae_r2(config, tmp_path):
  config.dataset = ml_collections.ConfigDict({"name": "user_datasets:FloatLabels", "data_dir": str(tmp_path / "tfds")})
  config.num_train_steps, config.batch_size, config.learning_rate = 60, 24, 1e-2
  parts = build.build(config)
  assert parts.task_info.describe() == "regression (inferred from float labels)"
  lines = summary.describe(parts.config, parts.backend, parts.layout, parts.ds, parts.model, parts.task_info.describe())
  assert lines["task"] == "regression (inferred from float labels)" and "float labels ()" in lines["data"]
  assert list(lines).index("task") == list(lines).index("data") + 1
  result = train.train_and_evaluate(config, str(tmp_path / "run"))
  got = result.eval_metrics
  assert {"eval/loss", "eval/mse", "eval/mae", "eval/r2"} <= set(got) and not any("/_" in k for k in got)
  y = np.concatenate([b["labels"][b[REAL]] for b in data.eval_batches(
      parts.ds, "test", global_batch=24, process_index=0, process_count=1)]).astype(np.float64)
  np.testing.assert_allclose(got["eval/r2"], 1 - got["eval/mse"] / y.var(), rtol=1e-4)
  assert got["eval/r2"] > 0.8 and got["eval/mse"] == pytest.approx(got["eval/loss"])
  logged = {k for record in metrics.read(str(tmp_path / "run")) for k in record}
  assert {"train/mse", "train/mae"} <= logged and not any("/_" in k for k in logged), sorted(logged)  # No helpers.


def test_regression_reports_mse_mae_and_r2_over_real_rows_only():
  preds = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 2))  # 2 replicas x 3 examples x 2 targets.
  labels = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 2))
  real = jnp.array([[True, True, False], [True, False, True]])
  got = _evaluated(tasks.Regression(), preds, labels, real)
  error, y = np.asarray(preds - labels)[np.asarray(real)], np.asarray(labels, np.float64)[np.asarray(real)]
  np.testing.assert_allclose(got["eval/mse"], np.square(error).mean(), rtol=1e-5)
  np.testing.assert_allclose(got["eval/mae"], np.abs(error).mean(), rtol=1e-5)
  np.testing.assert_allclose(got["eval/r2"], 1 - np.square(error).mean() / y.var(), rtol=1e-4)
  constant = _evaluated(tasks.Regression(), preds, jnp.ones_like(labels), real)
  assert np.isnan(constant["eval/r2"]) and constant["eval/mse"] > 0  # No variance to explain: R² is undefined.


class _Affine(nnx.Module):
  """pred = 1000 + 0.7 x0: a regressor of targets far from 0, its parameters set by hand."""

  def __init__(self):
    self.linear = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    self.linear.kernel[...] = jnp.array([[0.7], [0.0], [0.0], [0.0]])
    self.linear.bias[...] = jnp.array([1000.0])

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.linear(x)


def _far_from_zero(n: int, seed: int) -> dict[str, np.ndarray]:
  """Targets 1000 + N(0, 1): a variance of 1 under a mean square of 10⁶, which float32 sums of y and y² lose."""
  x = np.random.RandomState(seed).randn(n, 4).astype(np.float32)
  return {"inputs": x, "labels": (1000 + 0.7 * x[:, 0] + 0.7 * x[:, 1]).astype(np.float32)}


def test_r2_of_targets_with_a_large_mean_matches_numpy_float64_through_the_eval_path():
  config = default.get_config()
  config.batch_size, config.eval_batch_size = 64, 64
  parts = build.build(config, model=_Affine(), train_data=_far_from_zero(256, 0), eval_data=_far_from_zero(1000, 1))
  assert parts.task_info.describe() == "regression (inferred from float labels)"
  first = _far_from_zero(256, 0)["labels"][:64].astype(np.float64)
  assert parts.task.center == float(np.float32(first.mean()))  # From the first train targets, before any eval.
  state = parts.backend.init(parts.init)
  got = evaluate.run(parts, state)
  params, model_state = parts.backend.get((state.params, state.model_state))
  test = _far_from_zero(1000, 1)
  preds = np.asarray(parts.model.apply(params, model_state, jnp.asarray(test["inputs"]), train=False)[0], np.float64)
  y = test["labels"].astype(np.float64)
  r2 = 1 - np.mean((preds[:, 0] - y) ** 2) / y.var()
  assert got["eval/num_examples"] == 1000 and 0.3 < r2 < 0.7, r2
  assert abs(got["eval/r2"] - r2) < 1e-4, (got["eval/r2"], r2)


def test_r2_center_may_be_set_and_does_not_change_r2_where_float32_holds():
  config = default.get_config()
  config.task.name, config.task.center = "regression", 3.0
  assert tasks.get(config, None, targets=lambda: np.full(4, 1000.0)).center == 3.0  # Set: never read from data.
  preds = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 2))
  labels = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 2))
  real = jnp.array([[True, True, False], [True, False, True]])
  plain, centered = (_evaluated(tasks.Regression(center=c), preds, labels, real)["eval/r2"] for c in (None, 3.0))
  np.testing.assert_allclose(centered, plain, rtol=1e-5)


def test_tasks_get_names_unknown_tasks_and_fields_in_one_line_and_keeps_label_smoothing():
  facts = type("Facts", (), {"float_labels": False})()
  config = default.get_config()
  config.task.label_smoothing = 0.1
  assert tasks.get(config, facts) == tasks.Classification(label_smoothing=0.1)
  assert tasks.resolve(config, facts).describe() == "classification (inferred from integer labels)"
  config.task.name = "next_token"
  assert tasks.get(config, facts) == tasks.NextToken(label_smoothing=0.1)
  for name, task_fields, said in [("nope", {}, "unknown task 'nope'"), ("my_tasks:nope", {}, "unknown task"),
                                  (FOCAL, {"gama": 1.0}, "config.task.gama"), ("my_tasks:Scaled", {"scal": 2}, "scal"),
                                  ("classification", {"smoothing": 1}, "config.task.smoothing")]:
    c = default.get_config()
    c.task.name = name
    c.task.update(task_fields)
    with pytest.raises(ConfigError, match=said) as e:
      tasks.get(c, facts)
    assert "\n" not in str(e.value)
  c = default.get_config()
  c.task.name, c.task.scale = "my_tasks:Scaled", 3.0
  assert tasks.get(c, facts).scale == 3.0
  c = default.get_config()
  c.task.name = "my_tasks:Scaled"
  assert tasks.get(c, facts, task=my_tasks.focal) is my_tasks.focal  # An object from Python overrides the name.
  assert tasks.headline(my_tasks.focal) == ("confidence",) and tasks.headline(tasks.Regression()) == ("mse",)


INTEGER_LABELS = type("Facts", (), {"float_labels": False})()


def _loss_and_metrics(task, seed: int = 0) -> tuple[np.ndarray, dict]:
  """`task` on 6 examples of 5 classes, the model returning its inputs as logits."""
  logits = jax.random.normal(jax.random.PRNGKey(seed), (6, 5))
  batch = {"inputs": logits, "labels": jnp.arange(6) % 5}
  loss, got = task(_bound(dtype=jnp.float32, cast_inputs=True), batch)
  return np.asarray(loss), {k: np.asarray(getattr(v, "values", v)) for k, v in got.items()}


def test_config_task_fields_bind_to_a_task_function_passed_from_python():
  config = default.get_config()
  config.task.gamma = 0.0  # Focal loss with gamma 0 is cross-entropy.
  loss, _ = _loss_and_metrics(tasks.get(config, INTEGER_LABELS, task=my_tasks.focal))
  logits = jax.random.normal(jax.random.PRNGKey(0), (6, 5))
  ce = np.asarray(cross_entropy(logits, jnp.arange(6) % 5))
  np.testing.assert_allclose(loss, ce, rtol=1e-6)
  assert not np.allclose(_loss_and_metrics(my_tasks.focal)[0], ce, rtol=1e-3)  # Else gamma's default would pass.
  config = default.get_config()
  config.task.gama = 0.0
  with pytest.raises(ConfigError, match=r"task '<object my_tasks.focal>' takes no field config\.task\.gama \(its keyword arguments: "
                                        r"gamma\)$"):
    tasks.get(config, INTEGER_LABELS, task=my_tasks.focal)


@pytest.mark.parametrize("passed", [False, True])
def test_a_task_taking_kwargs_is_given_every_field(passed):
  config = default.get_config()
  config.task.scale, config.task.anything = 3.0, 0.5
  task = my_tasks.loose if passed else None
  if not passed:
    config.task.name = "my_tasks:loose"
  loss, got = _loss_and_metrics(tasks.get(config, INTEGER_LABELS, task=task))
  plain, _ = _loss_and_metrics(my_tasks.loose)
  np.testing.assert_allclose(loss, 3.0 * plain, rtol=1e-6)
  assert sorted(got) == ["anything", "scale"] and got["anything"].tolist() == [0.5] * 6


def test_label_smoothing_is_a_task_argument_however_the_task_is_reached():
  """config.task.label_smoothing is Classification's (and its subclasses') keyword argument, named, inferred or
  passed as a class, and a task function's of its own; a task without one refuses it; the top-level key is gone."""
  config = default.get_config()
  config.task.label_smoothing = 0.2
  for name in ("", "classification", "next_token", "my_tasks:MyClassification"):
    config.task.name = name
    assert tasks.get(config, INTEGER_LABELS).label_smoothing == 0.2, name
  assert tasks.get(config, INTEGER_LABELS, task=tasks.Classification).label_smoothing == 0.2
  assert tasks.get(config, INTEGER_LABELS, task=tasks.NextToken) == tasks.NextToken(label_smoothing=0.2)
  assert tasks.get(default.get_config(), INTEGER_LABELS).label_smoothing == 0.0  # The task's own default.
  # A function with a label_smoothing field of its own: the same value named or passed.
  for task_fields, want in (({}, 0.0), ({"label_smoothing": 0.3}, 0.3)):
    config = default.get_config()
    config.task.update(task_fields)
    passed = tasks.get(config, INTEGER_LABELS, task=my_tasks.smoothed)
    config.task.name = "my_tasks:smoothed"
    named = tasks.get(config, INTEGER_LABELS)
    assert [_loss_and_metrics(t)[1]["smoothing"][0] for t in (passed, named)] == [np.float32(want)] * 2, task_fields
  config = default.get_config()
  config.task.name, config.task.label_smoothing = "regression", 0.1
  with pytest.raises(ConfigError, match=r"task 'regression' takes no field config\.task\.label_smoothing"):
    tasks.get(config, INTEGER_LABELS)
  config.task.name, config.task.label_smoothing = "classification", 1.0
  with pytest.raises(ConfigError, match=r"^task\.label_smoothing must be a number in \[0, 1\), got 1\.0$"):
    tasks.get(config, INTEGER_LABELS)
  with pytest.raises(ConfigError, match="config key 'label_smoothing' was removed .*config.task.label_smoothing"):
    config_lib.with_defaults(ml_collections.ConfigDict({"label_smoothing": 0.1}))


def test_label_smoothing_shapes_the_train_loss_only_the_eval_loss_stays_plain():
  config = default.get_config()
  config.task.label_smoothing = 0.3
  task = tasks.get(config, INTEGER_LABELS)
  logits = jax.random.normal(jax.random.PRNGKey(0), (6, 5))
  labels = jnp.arange(6) % 5
  plain = np.asarray(cross_entropy(logits, labels))
  np.testing.assert_allclose(task.loss(logits, labels, train=False), plain, rtol=1e-6)
  assert np.all(np.asarray(task.loss(logits, labels, train=True)) != plain)  # Smoothed: every example moved.
  got = _evaluated(task, logits.reshape(2, 3, 5), labels.reshape(2, 3), jnp.ones((2, 3), bool))
  np.testing.assert_allclose(got["eval/loss"], plain.mean(), rtol=1e-6)


def test_metric_keys_that_become_one_name_are_refused_naming_them():
  batch = {"inputs": jnp.ones((2, 3))}
  bound = _bound(dtype=jnp.float32, cast_inputs=True)
  with pytest.raises(ConfigError, match=r"^task metric keys \['1', 1\] name one metric twice") as e:
    task_lib.run(lambda m, b: (m(b["inputs"]).sum(-1), {1: b["inputs"], "1": b["inputs"], "x": b["inputs"]}),
                 bound, batch)
  assert "\n" not in str(e.value) and "'x'" not in str(e.value)
  with pytest.raises(ConfigError, match=r"^task metric keys \['loss'\] name one metric twice.*'loss' is the loss's"):
    task_lib.run(lambda m, b: (m(b["inputs"]).sum(-1), {"loss": b["inputs"]}), bound, batch)


def _bound(**kwargs) -> task_lib.BoundModel:
  """A model that returns its input: what the task seam hands a task, alone."""
  return task_lib.BoundModel(lambda p, s, x, train, rng: (x, s), {}, {}, train=True, rng=None, **kwargs)


def test_a_metric_of_no_known_kind_or_a_summed_loss_is_refused():
  bound = _bound(dtype=jnp.float32, cast_inputs=True)
  batch = {"inputs": jnp.ones((2, 3))}
  with pytest.raises(ConfigError, match="reduce must be one of"):
    task_lib.run(lambda m, b: (m(b["inputs"]), {"x": tasks.Metric(b["inputs"], reduce="median")}), bound, batch)
  with pytest.raises(ConfigError, match="loss must reduce by mean"):
    task_lib.run(lambda m, b: (tasks.Metric(m(b["inputs"]), reduce="sum"), {}), bound, batch)


def _evaluated(task: task_lib.Task, outputs: jax.Array, labels: jax.Array, real: jax.Array) -> dict[str, float]:
  """The eval metrics of `task` on one batch over 2 replicas, the model's outputs being `outputs` (its inputs)."""
  return metrics.summarize_eval(runs.eval_sums(task, outputs, labels, real), task)


def test_next_token_reports_per_token_loss_accuracy_and_bits_per_byte_over_real_rows_only():
  """Label smoothing shapes the train loss only: the eval loss and the bits per byte are the plain code length."""
  logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 4, 5))   # 2 replicas x 3 examples x 4 tokens.
  labels = jax.random.randint(jax.random.PRNGKey(1), (2, 3, 4), 0, 5)
  real = jnp.array([[True, True, False], [True, False, False]])
  got = _evaluated(tasks.NextToken(bytes_per_token=2.0, label_smoothing=0.1), logits, labels, real)
  ce = np.asarray(cross_entropy(logits, labels))[np.asarray(real)]
  hits = (np.asarray(logits).argmax(-1) == np.asarray(labels))[np.asarray(real)]
  assert got["eval/num_examples"] == 3
  np.testing.assert_allclose(got["eval/loss"], ce.mean(), rtol=1e-6)
  np.testing.assert_allclose(got["eval/accuracy"], hits.mean(), rtol=1e-6)
  np.testing.assert_allclose(got["eval/bits_per_byte"], ce.mean() / np.log(2) / 2.0, rtol=1e-5)


def test_a_scalar_metric_is_refused_naming_it():
  with pytest.raises(ConfigError, match="task metric 'total' must have per-example values"):
    task_lib.run(lambda m, b: (m(b["inputs"]).sum(-1), {"total": b["inputs"].sum()}),
                 _bound(dtype=jnp.float32, cast_inputs=True), {"inputs": jnp.ones((2, 3))})


def test_weighted_metrics_reduce_by_kind_to_sums_and_a_mean_over_its_total_weight():
  values, weights = jnp.array([1.0, 2.0, 3.0]), jnp.array([1.0, 0.0, 3.0])  # Weights summing to 4, not to 3 rows.
  sums = task_lib.by_kind({"loss": tasks.Metric(values, weights), "s": tasks.Metric(values, weights, reduce="sum"),
                           "n": tasks.Metric(values, reduce="sum"), "m": tasks.Metric(values, reduce="max")})
  assert {k: {n: float(v) for n, v in g.items()} for k, g in sums.items()} == {
      "mean": {"loss": 10.0}, "weight": {"loss": 4.0}, "sum": {"s": 10.0, "n": 6.0}, "max": {"m": 3.0},
      "negative": {"loss": 0.0}}  # A mean's negative weights, counted to be refused.
  assert float(task_lib.means(sums)["loss"]) == 2.5
  empty = {**sums, "weight": {"loss": jnp.float32(0)}, "mean": {"loss": jnp.float32(0)}}
  assert float(task_lib.means(empty)["loss"]) == 0.0  # Nothing to average: 0, never NaN.


def test_no_gradient_flows_through_a_weight():
  def loss(w):
    return task_lib.by_kind({"loss": tasks.Metric(jnp.array([1.0, 2.0]), weights=w)})["mean"]["loss"]
  assert jax.grad(loss)(jnp.array([1.0, 3.0])).tolist() == [0.0, 0.0]


def test_padded_rows_never_reach_a_max_even_above_every_real_value():
  rows = task_lib.per_row({"m": tasks.Metric(jnp.array([-3.0, -2.0, 5.0]), reduce="max")}, jnp.array([1, 1, 0]))
  assert rows["max"]["m"].tolist() == [-3.0, -2.0, -np.inf]


def test_float_inputs_reach_the_model_in_the_compute_dtype_unless_they_are_token_ids():
  x = jnp.ones((2, 3), jnp.float32)
  assert _bound(dtype=jnp.bfloat16, cast_inputs=True)(x).dtype == jnp.bfloat16
  assert _bound(dtype=jnp.bfloat16, cast_inputs=False)(x).dtype == jnp.float32  # Ids above 256 stay exact.
  assert _bound(dtype=jnp.bfloat16, cast_inputs=True)(x.astype(jnp.int32)).dtype == jnp.int32


def test_a_task_sees_the_datasets_features_only_never_jaxdps_own_keys(config):
  seen = []

  def task(model, batch):
    seen.append((model.train, sorted(batch)))
    return cross_entropy(model(batch["inputs"]), batch["labels"]), {}

  parts = build.build(config, task=task)
  state = parts.backend.init(parts.init)
  batch = next(data.train_batches(parts.ds, "train", seed=0, global_batch=config.batch_size, start_step=0,
                                  process_index=0, process_count=1, with_ids=True))
  assert INDEX in batch  # The audit's ids ride with the batch ...
  state, _ = parts.train_step(state, parts.backend.put_step(batch))
  evaluate.run(parts, state)  # ... as eval batches carry which rows are real (padding) ...
  assert {train for train, _ in seen} == {True, False}, seen
  assert all(keys == ["inputs", "labels"] for _, keys in seen), seen  # ... but neither reaches the task.


def test_a_max_metric_below_zero_is_the_max_over_micro_batches(config):
  """Micro-batches' maxima start from -inf and replicas take the largest of theirs: all values here are below 0."""
  def task(model, batch):
    lowest = tasks.Metric(-1.0 - batch["labels"].astype(jnp.float32), reduce="max")
    return cross_entropy(model(batch["inputs"]), batch["labels"]), {"lowest": lowest}

  config.grad_accum_steps = 2
  parts = build.build(config, task=task)
  batch = next(data.train_batches(parts.ds, "train", seed=0, global_batch=config.batch_size, start_step=0,
                                  process_index=0, process_count=1))
  _, got = parts.train_step(parts.backend.init(parts.init), parts.backend.put_step(batch))
  assert float(np.asarray(parts.backend.get(got)["lowest"])) == -1.0 - batch["labels"].min()
