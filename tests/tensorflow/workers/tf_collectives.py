"""commlib.tensorflow on any number of ranks: every op eagerly and inside tf.function against numpy, the
gradients, IndexedSlices, the gradient tape, process sets, and mismatches failing on every rank.

Rank r's input is a known function of r, so every rank computes the expected result locally.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import commlib.tensorflow as hvd
import spmd

DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.uint8, tf.int16, tf.int32, tf.int64]


def data(r, shape, dtype=tf.float32):
    n = int(np.prod(shape)) if shape else 1
    return tf.cast(tf.reshape((np.arange(n) % 5) + r + 1, shape), dtype)


def check(actual, expected, what, tol=1e-6):
    actual = np.asarray(tf.cast(actual, tf.float64))
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert np.allclose(actual, expected, rtol=tol, atol=tol), f"{what}: {actual.ravel()[:6]} != {expected.ravel()[:6]}"


def both(fn):
    """``fn`` run eagerly and inside a tf.function (a fresh trace each time)."""
    return [("eager", fn), ("tf.function", tf.function(fn))]


me, n = spmd.rank_and_size()  # the job's, which commlib's are once init() ran


def everyone(shape, dt=tf.float64):
    """Every rank's input, stacked."""
    return np.stack([np.asarray(data(r, shape, dt)) for r in range(n)])


@spmd.case
def init():
    hvd.init()


@spmd.case
def allreduce_every_op_dtype_and_shape():
    for shape in [(), (1,), (n - 1 if n > 1 else 1,), (3, 5), (0, 2)]:
        for dtype in DTYPES:
            x = data(me, shape, dtype)
            all_x = everyone(shape)
            for mode, fn in both(lambda t: [hvd.allreduce(t, op=hvd.Sum), hvd.allreduce(t, op=hvd.Max),
                                             hvd.allreduce(t, op=hvd.Min)]):
                s, mx, mn = fn(x)
                tol = 1e-2 if dtype in (tf.float16, tf.bfloat16) else 1e-6
                check(s, all_x.sum(0), f"{mode} allreduce Sum {dtype.name} {shape}", tol)
                check(mx, all_x.max(0), f"{mode} allreduce Max {dtype.name} {shape}")
                check(mn, all_x.min(0), f"{mode} allreduce Min {dtype.name} {shape}")
                assert s.dtype == dtype and s.shape == shape


@spmd.case
def average_scaling_and_product():
    x = data(me, (4, 3))
    for mode, fn in both(lambda t: [hvd.allreduce(t), hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0,
                                                                     postscale_factor=0.5),
                                     hvd.allreduce(t, op=hvd.Product)]):
        avg, scaled, prod = fn(x)
        check(avg, everyone((4, 3)).mean(0), f"{mode} Average")
        check(scaled, everyone((4, 3)).sum(0), f"{mode} prescale/postscale")
        check(prod, everyone((4, 3)).prod(0), f"{mode} Product")


@spmd.case
def grouped_compressed_and_the_other_collectives():
    # grouped allreduce of mixed dtypes, fp16 compression, allgather of uneven rows, broadcast, alltoall,
    # reducescatter, grouped forms
    for mode, fn in both(lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum, compression=hvd.Compression.fp16)):
        a, b = fn(data(me, (5,)), data(me, (2, 2), tf.int32))
        check(a, everyone((5,)).sum(0), f"{mode} grouped fp16", 1e-2)
        check(b, everyone((2, 2)).sum(0), f"{mode} grouped int32")
        assert a.dtype == tf.float32 and b.dtype == tf.int32
    rows = lambda r: data(r, (r + 1, 2))  # noqa: E731
    for mode, fn in both(lambda t, u: [hvd.allgather(t), hvd.broadcast(u, root_rank=n - 1)]):
        g, b = fn(rows(me), data(me, (2, 2)))
        check(g, np.concatenate([np.asarray(rows(r), np.float64) for r in range(n)]), f"{mode} allgather")
        check(b, np.asarray(data(n - 1, (2, 2)), np.float64), f"{mode} broadcast")
    for mode, fn in both(lambda t: hvd.grouped_allgather([t, tf.cast(t, tf.int64)])):
        g1, g2 = fn(data(me, (2,)))
        check(g1, everyone((2,)).reshape(-1), f"{mode} grouped_allgather")
        check(g2, everyone((2,)).reshape(-1), f"{mode} grouped_allgather int64")
    splits = [(me + r) % 3 for r in range(n)]
    t = tf.reshape(tf.range(sum(splits) * 2, dtype=tf.float32), (-1, 2)) + 100 * me
    for mode, fn in both(lambda t, s: hvd.alltoall(t, splits=s)):
        out, received = fn(t, tf.constant(splits))
        expect = []
        for src in range(n):
            src_splits = [(src + r) % 3 for r in range(n)]
            start = sum(src_splits[:me])
            block = np.arange(sum(src_splits) * 2, dtype=np.float64).reshape(-1, 2)[start:start + src_splits[me]]
            expect.append(block + 100 * src)
        check(out, np.concatenate(expect), f"{mode} alltoall")
        check(received, [(src + me) % 3 for src in range(n)], f"{mode} alltoall received splits")
    for mode, fn in both(lambda t: hvd.reducescatter(t, op=hvd.Sum)):
        out = fn(data(me, (2 * n + 1, 3)))
        full = everyone((2 * n + 1, 3)).sum(0)
        counts = [(2 * n + 1) // n + (1 if r < (2 * n + 1) % n else 0) for r in range(n)]
        start = sum(counts[:me])
        check(out, full[start:start + counts[me]], f"{mode} reducescatter")


@spmd.case
def gradients():
    # gradients: d/dx sum(allreduce(x) * w) etc., eagerly and in tf.function
    w = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3) + 1)
    for mode, fn in both(lambda v: _grads(v, w, n)):
        g_sum, g_avg, g_gather, g_bcast = fn(tf.constant(data(me, (2, 3))))
        check(g_sum, np.asarray(w) * n, f"{mode} allreduce Sum gradient")
        check(g_avg, np.asarray(w), f"{mode} allreduce Average gradient")
        check(g_gather, np.asarray(w), f"{mode} allgather gradient")
        check(g_bcast, np.asarray(w) if me == 0 else np.zeros((2, 3)), f"{mode} broadcast gradient")


@spmd.case
def indexed_slices():
    # IndexedSlices: values and indices allgathered; Average divides the values
    slices = tf.IndexedSlices(tf.fill([2, 3], float(me + 1)), tf.constant([me, me + 1], tf.int64),
                              dense_shape=tf.constant([n + 1, 3], tf.int64))
    for mode, fn in both(lambda: hvd.allreduce(slices, op=hvd.Average)):
        out = fn()
        assert isinstance(out, tf.IndexedSlices), f"{mode}: {type(out)}"
        dense = np.zeros((n + 1, 3))
        for r in range(n):
            dense[[r, r + 1]] += (r + 1) / n
        check(tf.convert_to_tensor(out), dense, f"{mode} IndexedSlices Average")


@spmd.case
def distributed_gradient_tape():
    # DistributedGradientTape: the averaged gradient of every rank's loss
    v = tf.Variable(tf.ones([3]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * float(me + 1))
    grads = hvd.DistributedGradientTape(tape).gradient(loss, [v])
    check(grads[0], np.full(3, np.mean(np.arange(1, n + 1))), "DistributedGradientTape")

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * float(me + 1)) + tf.reduce_sum(tf.square(v))
        return hvd.DistributedGradientTape(tape, op=hvd.Sum).gradient(loss, v)
    check(step(), np.full(3, np.sum(np.arange(1, n + 1)) + 2.0 * n), "DistributedGradientTape in tf.function")


@spmd.case
def broadcast_variables_and_objects():
    # broadcast_variables / broadcast_ / objects
    var = tf.Variable(tf.fill([4], float(me)))
    hvd.broadcast_variables([var], root_rank=n - 1)
    check(var, np.full(4, n - 1.0), "broadcast_variables")
    var2 = tf.Variable(tf.fill([2], float(me)))
    hvd.broadcast_([var2], root_rank=0)
    check(var2, np.zeros(2), "broadcast_")
    assert hvd.broadcast_object({"a": me}, root_rank=n - 1) == {"a": n - 1}
    assert hvd.allgather_object(me) == list(range(n))


@spmd.case
def a_process_set():
    # a process set of the even ranks
    if n > 1:  # (on one rank the evens are the world, which is registered already)
        evens = hvd.add_process_set(list(range(0, n, 2)))
        if evens.included():
            for mode, fn in both(lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=evens)):
                check(fn(tf.constant([float(me)])), [float(sum(range(0, n, 2)))], f"{mode} allreduce on a process set")
        hvd.remove_process_set(evens)


@spmd.case
def mismatches_fail_on_every_rank():
    # mismatches: the same name with different shapes fails on every rank, eagerly and in tf.function,
    # with FailedPreconditionError naming the tensor; commlib keeps working afterwards
    if n > 1:
        for mode, fn in both(lambda t: hvd.allreduce(t, name=f"mismatch")):
            try:
                fn(tf.zeros([me + 1]))
            except tf.errors.FailedPreconditionError as exc:
                assert "mismatch" in str(exc), str(exc)
            else:
                raise AssertionError(f"{mode}: mismatched shapes were not an error")
        check(hvd.allreduce(tf.ones([2]), op=hvd.Sum), np.full(2, n), "allreduce after a mismatch")


@spmd.case
def xla_compilation_is_an_error():
    # XLA cannot compile the op: an error, not a hang
    try:
        tf.function(lambda t: hvd.allreduce(t), jit_compile=True)(tf.ones([2]))
    except tf.errors.InvalidArgumentError as exc:
        assert "PyFunc" in str(exc) or "XLA" in str(exc), str(exc)[:200]
    else:
        raise AssertionError("jit_compile=True with a collective was not an error")


@spmd.case
def shutdown():
    hvd.barrier()
    hvd.shutdown()


def _grads(x, w, n):
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        s = tf.reduce_sum(hvd.allreduce(x, op=hvd.Sum) * w)
        a = tf.reduce_sum(hvd.allreduce(x, op=hvd.Average) * w)
        g = tf.reduce_sum(hvd.allgather(x) * tf.tile(w, [n, 1]))
        b = tf.reduce_sum(hvd.broadcast(x, root_rank=0) * w)
    return [tape.gradient(y, x) for y in (s, a, g, b)]


if __name__ == "__main__":
    spmd.main()
