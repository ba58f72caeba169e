"""The stateless train order (`jaxdp.data.order`): a pure function of (seed, step), from any thread, in any order."""

import random
import threading
from concurrent import futures

import numpy as np
import pytest

from jaxdp.config import ConfigError
from jaxdp.data import order as sampler

N, B, SEED = 40, 8, 3  # 5 steps per epoch: 30 epochs in 150 steps.
EPOCHS = 30


def _reference(n: int, batch: int, seed: int, steps: range, lo: int, hi: int) -> dict[int, np.ndarray]:
  """rows(step, lo, hi) for each step, straight from the documented formula, one thread, in order."""
  per_epoch = n // batch
  out = {}
  for step in steps:
    epoch, k = divmod(step, per_epoch)
    rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([seed, 1, epoch])))  # Stream 1: the shuffle.
    out[step] = rng.permutation(n)[k * batch + lo:k * batch + hi]
  return out


def test_the_order_is_the_keyed_permutation_of_each_epoch():
  order = sampler.GlobalOrder(N, B, SEED, "train")
  steps = range(3 * N // B)
  expected = _reference(N, B, SEED, steps, 2, 6)
  for step in steps:
    np.testing.assert_array_equal(order.rows(step, 2, 6), expected[step])
  assert len(set(np.concatenate([order.rows(s, 0, B) for s in range(N // B)]))) == N  # One epoch: each once.
  assert not order.rows(0, 0, B).flags.writeable  # Shared by every caller: nobody may reorder it in place.


@pytest.mark.parametrize("trial", range(3))
def test_sixteen_threads_in_random_step_order_get_the_single_threaded_rows(trial):
  """tf.data calls `rows` from parallel workers, an older epoch after a newer one: every call must answer."""
  steps = range(EPOCHS * N // B)
  expected = _reference(N, B, SEED, steps, 0, B)
  calls = [s for s in steps for _ in range(8)]
  random.Random(trial).shuffle(calls)
  order = sampler.GlobalOrder(N, B, SEED, "train")
  with futures.ThreadPoolExecutor(16) as pool:
    got = list(pool.map(lambda s: (s, order.rows(s, 0, B)), calls))
  assert len(got) == len(calls)
  for step, rows in got:
    np.testing.assert_array_equal(rows, expected[step])


def test_only_a_few_epochs_are_held():
  order = sampler.GlobalOrder(N, B, SEED, "train")
  for step in range(EPOCHS * N // B):
    order.rows(step, 0, B)
  assert len(sampler._held) == sampler.EPOCHS_HELD < EPOCHS  # The newest epochs stay: the next one, a straggler.


def test_the_least_recently_used_epoch_is_the_one_let_go():
  """An epoch asked for again (the audit behind the stream) stays held; the one nobody asked for since goes."""
  order = sampler.GlobalOrder(N, B, SEED + 100, "train")  # A seed no other test holds epochs of.
  first = {epoch: order.permutation(epoch) for epoch in range(sampler.EPOCHS_HELD)}
  assert order.permutation(0) is first[0]
  order.permutation(sampler.EPOCHS_HELD)  # One epoch more than are held: epoch 1 is the least recently used.
  assert order.permutation(0) is first[0] and order.permutation(1) is not first[1]


def test_threads_asking_for_a_new_epoch_at_once_share_one_array():
  """However many workers compute an epoch at the same moment, all keep the one held: n int64, not n per thread."""
  barrier = threading.Barrier(8)

  def ask(epoch: int) -> np.ndarray:
    barrier.wait()
    return sampler.permutation(200_000, SEED, epoch)

  for epoch in range(3):
    with futures.ThreadPoolExecutor(8) as pool:
      got = list(pool.map(ask, [epoch] * 8))
    assert all(order is got[0] for order in got)


def test_orders_of_the_same_split_and_seed_share_each_epochs_permutation():
  """The train stream and the audit each hold an order: the epoch the stream shuffled, the audit must not redo."""
  stream, audit = sampler.GlobalOrder(N, B, SEED, "train"), sampler.GlobalOrder(N, 2 * B, SEED, "train")
  assert audit.permutation(7) is stream.permutation(7)
  assert sampler.GlobalOrder(N, B, SEED + 1, "train").permutation(7) is not stream.permutation(7)


def test_a_batch_larger_than_the_split_names_the_flag_to_change():
  with pytest.raises(ConfigError, match=r"batch \(128\) exceeds the 108 examples of split 'train'.*--config\.batch_size"):
    sampler.GlobalOrder(108, 128, 0, "train")


def test_a_split_of_exactly_one_batch_trains_and_one_row_fewer_is_an_error():
  assert sampler.GlobalOrder(B, B, 0, "train").steps_per_epoch == 1
  with pytest.raises(ConfigError, match=rf"batch \({B}\) exceeds the {B - 1} examples"):
    sampler.GlobalOrder(B - 1, B, 0, "train")
