"""commlib.jax's optax wrappers on any number of ranks: training with DistributedOptimizer gives the
parameters of one process training on the combined batch (SGD and Adam, with backward_passes_per_step);
fp16 and a lossy compressor through the wrapper; LocalSGD against a simulation of every rank.

Every rank can compute the single-process reference itself: the data are a known function of the seed.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
import optax

import commlib.jax as cj
import spmd

LOCAL_BATCH, FEATURES, HIDDEN, CLASSES, STEPS = 8, 12, 16, 4, 6


def make_data(n):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((STEPS, 2, n * LOCAL_BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, (STEPS, 2, n * LOCAL_BATCH))
    return x, y


def init_params():
    rng = np.random.default_rng(0)
    return {"hidden": {"w": jnp.asarray(rng.standard_normal((FEATURES, HIDDEN)) * 0.3, jnp.float32),
                       "b": jnp.zeros(HIDDEN, jnp.float32)},
            "out": {"w": jnp.asarray(rng.standard_normal((HIDDEN, CLASSES)) * 0.3, jnp.float32),
                    "b": jnp.zeros(CLASSES, jnp.float32)}}


def loss(params, x, y):
    h = jnp.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
    logits = h @ params["out"]["w"] + params["out"]["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def train(tx, xs, ys, params, micro_batches=1):
    """Steps of ``tx`` on batches ``xs[step, micro]`` (each rank passes its own shard)."""
    state = tx.init(params)

    @jax.jit
    def step(params, state, x, y):
        updates, state = tx.update(jax.grad(loss)(params, x, y), state, params)
        return optax.apply_updates(params, updates), state

    for s in range(STEPS):
        for m in range(micro_batches):
            params, state = step(params, state, xs[s, m], ys[s, m])
    return params


def assert_close(a, b, what, tol):
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
        diff = float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
        assert diff <= tol, f"{what}: {jax.tree_util.keystr(path)} differs by {diff} (tolerance {tol})"


def assert_same_on_all_ranks(params, what):
    mine = [np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves(params)]
    for q, theirs in enumerate(cj.allgather_object(mine)):
        assert theirs == mine, f"{what}: parameters differ between rank {cj.rank()} and rank {q}"


def check_equivalence(r, n, xs, ys):
    shard = slice(r * LOCAL_BATCH, (r + 1) * LOCAL_BATCH)
    for label, make in (("sgd", lambda: optax.sgd(0.5)), ("adam", lambda: optax.adam(0.05))):
        mine = train(cj.DistributedOptimizer(make(), name=f"eq.{label}"), xs[:, :, shard], ys[:, :, shard],
                     init_params())
        combined = train(make(), xs, ys, init_params())
        assert_close(mine, combined, f"{label}: {n} ranks vs one process on the combined batch", 2e-5)
        assert_same_on_all_ranks(mine, label)
        # distributed_gradients in a chain is the same transformation
        chained = train(optax.chain(cj.distributed_gradients(name=f"chain.{label}"), make()), xs[:, :, shard],
                        ys[:, :, shard], init_params())
        assert_close(chained, mine, f"{label}: chain vs DistributedOptimizer", 1e-6)
        # overlap=False (one grouped allreduce after the backward pass) is the same transformation
        grouped = train(cj.DistributedOptimizer(make(), name=f"grouped.{label}", overlap=False),
                        xs[:, :, shard], ys[:, :, shard], init_params())
        assert_close(grouped, mine, f"{label}: overlap=False vs overlap=True", 1e-6)
    # backward_passes_per_step=2: the mean of two micro-batches on every rank, applied every other update
    mine = train(cj.DistributedOptimizer(optax.sgd(0.5), backward_passes_per_step=2, name="eq.bpps"),
                 xs[:, :, shard], ys[:, :, shard], init_params(), micro_batches=2)
    both = xs.transpose(0, 2, 1, 3).reshape(STEPS, 1, -1, FEATURES)  # both micro-batches of every rank
    both_y = ys.transpose(0, 2, 1).reshape(STEPS, 1, -1)
    assert_close(mine, train(optax.sgd(0.5), both, both_y, init_params()), "backward_passes_per_step=2", 2e-5)
    # gradient_predivide_factor splits the average around the sum: the same result
    pre = train(cj.DistributedOptimizer(optax.sgd(0.5), gradient_predivide_factor=2.0, name="eq.pre"),
                xs[:, :, shard], ys[:, :, shard], init_params())
    assert_close(pre, train(optax.sgd(0.5), xs, ys, init_params()), "gradient_predivide_factor", 2e-5)


def check_compression(r, n, xs, ys):
    shard = slice(r * LOCAL_BATCH, (r + 1) * LOCAL_BATCH)
    combined = train(optax.sgd(0.5), xs, ys, init_params())
    fp16 = train(cj.DistributedOptimizer(optax.sgd(0.5), compression=cj.Compression.fp16, name="c.fp16"),
                 xs[:, :, shard], ys[:, :, shard], init_params())
    assert_close(fp16, combined, "fp16 on the wire", 5e-3)
    assert_same_on_all_ranks(fp16, "fp16")
    # A lossy compressor keeps per-tensor state (error feedback) in the compressor, by the leaf names.
    topk = cj.Compression.topk(0.25, min_elements=16)
    params = init_params()
    first = float(loss(params, xs[0, 0], ys[0, 0]))
    lossy = train(cj.DistributedOptimizer(optax.sgd(0.5), compression=topk, name="c.topk"),
                  xs[:, :, shard], ys[:, :, shard], params)
    assert_same_on_all_ranks(lossy, "top-k")
    assert float(loss(lossy, xs[0, 0], ys[0, 0])) < first, "top-k training did not reduce the loss"
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(lossy),
                                                       jax.tree_util.tree_leaves(combined))) or n == 1


def check_local_sgd(r, n, xs, ys):
    period, warmup = 3, 1
    shard = lambda q: slice(q * LOCAL_BATCH, (q + 1) * LOCAL_BATCH)  # noqa: E731
    mine = train(cj.LocalSGD(optax.sgd(0.5), period=period, warmup_steps=warmup), xs[:, :, shard(r)],
                 ys[:, :, shard(r)], init_params())
    # simulate every rank: local SGD steps, averaged after step 1 (warm-up) and every third step after it
    sims = [init_params() for _ in range(n)]
    for s in range(STEPS):
        sims = [jax.tree_util.tree_map(lambda p, g: p - 0.5 * g, p, jax.grad(loss)(p, xs[s, 0, shard(q)],
                                                                                  ys[s, 0, shard(q)]))
                for q, p in enumerate(sims)]
        count = s + 1
        if count <= warmup or (count - warmup) % period == 0:
            mean = jax.tree_util.tree_map(lambda *ps: sum(ps) / n, *sims)
            sims = [mean] * n
    assert_close(mine, sims[r], "LocalSGD vs a simulation of every rank", 2e-5)


DATA: list = []  # the combined batch, made once the job's size is known


@spmd.case
def init():
    cj.init()
    DATA[:] = make_data(cj.size())


def with_data(check):
    """``check(r, n, xs, ys)`` as a check of (r, n), on the combined batch."""
    def checked(r, n):
        check(r, n, *DATA)
    checked.__name__ = check.__name__
    return checked


spmd.rank_cases(lambda: (cj.rank(), cj.size()), *map(with_data, (check_equivalence, check_compression,
                                                                 check_local_sgd)))


@spmd.case
def shutdown():
    cj.shutdown()


if __name__ == "__main__":
    spmd.main()
