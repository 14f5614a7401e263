"""push_pull through summation servers against numpy, on every worker of an MPMD job.

argv: the cases to run (comma-separated): values, orders, wire, ps, sets, mismatch, lonely, host (with
COMMLIB_SERVER_HOST_REDUCE=on and hosts of several workers), lossy, reinit; each a named case on every
worker (tests/spmd.py), between init and shutdown (reinit after it). sets needs 3 workers, mismatch and
lonely 2: they skip on fewer.
Runs with a small COMMLIB_SERVER_PARTITION so that modest sizes span several partitions.
"""

import sys
import time

import ml_dtypes
import numpy as np

import commlib as cl
import spmd
from commlib.server.client import ServerError

PART = int(__import__("os").environ["COMMLIB_SERVER_PARTITION"])
#: far above COMMLIB_SERVER_TIMEOUT (3 s in the tests) on any load: the bound is the feature (a key no
#: other worker pushes fails instead of waiting forever), not how fast a loaded machine says so
FAILS_WITHIN_S = 60.0
rank = size = 0


@spmd.case
def init():
    global rank, size
    cl.init()
    rank, size = cl.rank(), cl.size()
    assert cl.num_servers() >= 1


def same_on_every_worker(arr, what):
    """The bytes of ``arr`` are equal on every worker."""
    raw = np.frombuffer(np.ascontiguousarray(arr).tobytes(), np.uint8)
    every = cl.allgather(raw[None, :] if raw.size else np.zeros((1, 0), np.uint8), name=f"bits.{what}")
    for r in range(size):
        assert np.array_equal(every[r], every[0]), f"{what}: worker {r}'s bits differ from worker 0's"


def data(dtype, n, r, salt=0):
    """Small integers (exact in every dtype and any summation order)."""
    base = (np.arange(n, dtype=np.int64) * 7 + r * 3 + salt) % 11 - (0 if np.dtype(dtype).kind == "u" else 5)
    return base.astype(dtype)


@spmd.case
def values():
    dtypes = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32, np.int64, np.int8, np.uint8,
              np.int16]
    itemsize_max = 8
    sizes = [0, 1, size - 1 if size > 1 else 2, 1000, 3 * PART // 4 + 5, 5 * PART // 4 + 3]
    for dtype in dtypes:
        for n in sizes:
            for op in (cl.Sum, cl.Average):
                if op is cl.Average and np.dtype(dtype).kind in "iu":
                    continue  # integer averages truncate per worker order; checked by the allreduce tests
                name = f"v.{np.dtype(dtype).name}.{n}.{op.name}"
                x = data(dtype, n, rank).reshape(-1, 1) if n % 2 == 0 and n else data(dtype, n, rank)
                expect = sum(data(dtype, n, r).astype(np.float64) for r in range(size)).reshape(x.shape)
                if op is cl.Average:
                    expect = expect / size
                got = cl.push_pull(x, op=op, name=name)
                assert got.dtype == x.dtype and got.shape == x.shape, (name, got.dtype, got.shape)
                tol = 1e-2 if np.dtype(dtype) in (np.float16, ml_dtypes.bfloat16) else 1e-6
                assert np.allclose(got.astype(np.float64), expect, rtol=tol, atol=tol), \
                    (name, got.reshape(-1)[:5], expect.reshape(-1)[:5])
                same_on_every_worker(got, name)
                # in place, random floats: equal bits everywhere, close to numpy's sum
                if np.dtype(dtype).kind == "f" and n:
                    y = np.random.default_rng(rank * 100 + n).standard_normal(n).astype(dtype)
                    ref = y.astype(np.float64)
                    every = cl.allgather(ref, name=f"ref.{name}")
                    cl.push_pull_(y, op=op, name=name + ".r")
                    want = every.reshape(size, n).sum(0) / (size if op is cl.Average else 1)
                    assert np.allclose(y.astype(np.float64), want, rtol=tol * 4, atol=tol * 4), name
                    same_on_every_worker(y, name + ".r")
    # Min / Max also reduce at the servers
    x = data(np.float32, 2 * PART // 4, rank)
    got = cl.push_pull(x, op=cl.Max, name="v.max")
    assert np.array_equal(got, np.max([data(np.float32, x.size, r) for r in range(size)], 0))


@spmd.case
def orders():
    # many tensors in flight at once, submitted in a different order on every worker, synchronized in yet
    # another order; the same name pushed again afterwards (next round of each key)
    rng = np.random.default_rng(rank)
    shapes = [(i * 97) % (3 * PART // 4 + 11) + 1 for i in range(24)]
    for rnd in range(2):
        order = rng.permutation(len(shapes))
        handles = {}
        for i in order:
            handles[i] = cl.push_pull_async(data(np.float32, shapes[i], rank, salt=i + rnd), op=cl.Sum,
                                            name=f"o.{i}")
        for i in rng.permutation(len(shapes)):
            got = cl.synchronize(handles[i])
            expect = sum(data(np.float32, shapes[i], r, salt=i + rnd) for r in range(size))
            assert np.array_equal(got, expect), (i, got[:4], expect[:4])


@spmd.case
def wire():
    for codec in (cl.Compression.fp16, cl.Compression.bf16):
        for op in (cl.Sum, cl.Average):
            n = 3 * PART // 4 + 17
            x = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
            every = cl.allgather(x.astype(np.float64), name=f"w.ref.{codec.name}.{op.name}").reshape(size, n)
            want = every.sum(0) / (size if op is cl.Average else 1)
            got = cl.push_pull(x, op=op, name=f"w.{codec.name}.{op.name}", compression=codec)
            assert got.dtype == np.float32
            tol = 2e-2 if codec is cl.Compression.bf16 else 4e-3
            assert np.allclose(got, want, rtol=tol, atol=tol * size), (codec, op, np.abs(got - want).max())
            same_on_every_worker(got, f"w.{codec.name}.{op.name}")
            # every value is a wire value times the scale the worker applied (one rounding at the server)
    # fp16 Sum beyond fp16's range per worker is still in range after the division by the workers
    big = np.full(10, 40000.0, np.float32)
    got = cl.push_pull(big, op=cl.Sum, name="w.range", compression=cl.Compression.fp16)
    assert np.allclose(got, 40000.0 * size, rtol=1e-3), got


@spmd.case
def ps():
    # algorithm="ps" through the coordinator: fusion, grouped calls, scaling, fp16, every rank the same bits
    xs = [data(np.float32, n, rank, salt=n) for n in (1, 5, 300, PART // 4 * 3 + 2)]
    got = cl.grouped_allreduce(xs, op=cl.Sum, algorithm="ps", name="g")
    for x, g in zip(xs, got):
        assert np.array_equal(g, sum(data(np.float32, x.size, r, salt=x.size) for r in range(size)))
    y = cl.allreduce(np.full(1000, float(rank + 1), np.float64), op=cl.Average, algorithm="ps",
                     prescale_factor=2.0, postscale_factor=0.5, name="s")
    assert np.allclose(y, (size + 1) / 2), y[:3]
    z = cl.allreduce(np.full(2 * PART, rank + 0.25, np.float32), op=cl.Sum, algorithm="ps", name="z",
                     compression=cl.Compression.fp16)
    assert np.allclose(z, size * (size - 1) / 2 + 0.25 * size, rtol=1e-3), z[:3]
    same_on_every_worker(z, "ps.z")


@spmd.case
def sets():
    if size < 3:
        spmd.skip("needs 3 workers")
    # a process set of workers 0 and 1: the servers count its two contributors, not every worker
    pair = cl.add_process_set([0, 1])
    if rank in (0, 1):
        got = cl.allreduce(np.full(PART, rank + 1, np.int32), op=cl.Sum, algorithm="ps", process_set=pair,
                           name="pair")
        assert np.all(got == 3), got[:3]
    cl.barrier()
    cl.remove_process_set(pair)


@spmd.case
def mismatch():
    if size < 2:
        spmd.skip("needs 2 workers")
    # rank 0 declares the key with another size or dtype: an error on every worker, never a hang
    for what, x in (("size", np.ones(10 + (rank == 0), np.float32)),
                    ("dtype", np.ones(10, np.float32 if rank else np.float64))):
        try:
            cl.push_pull(x, op=cl.Sum, name=f"m.{what}")
        except ServerError as exc:
            assert "declare every key alike" in str(exc) and "worker 0" in str(exc), str(exc)
            print(f"mismatch {what} refused on worker {rank}: {exc}", flush=True)
        else:
            raise AssertionError(f"mismatched {what} accepted")
    # the library keeps working
    assert np.all(cl.push_pull(np.ones(7, np.float32), op=cl.Sum, name="m.after") == size)


@spmd.case
def lonely():
    if size < 2:
        spmd.skip("needs 2 workers")
    # a key only worker 0 pushes: worker 0 fails within the timeout, naming the server and the key
    if rank == 0:
        start = time.monotonic()
        try:
            cl.push_pull(np.ones(3, np.float32), name="only-zero")
        except ServerError as exc:
            took = time.monotonic() - start
            assert "only-zero" in str(exc) and "server" in str(exc) and "COMMLIB_SERVER_TIMEOUT" in str(exc)
            assert took < FAILS_WITHIN_S, took
            print(f"lonely refused after {took:.1f} s: {exc}", flush=True)
        else:
            raise AssertionError("a key no other worker pushed completed")
    cl.barrier()


@spmd.case
def host():
    # every worker of a host reduces inside the host first (COMMLIB_SERVER_HOST_REDUCE=on, hosts of
    # COMMLIB_LOCAL_SIZE ranks): the servers receive each partition once per host
    from commlib import api
    from commlib.server import protocol

    runtime = api._rt()
    hosts = runtime.topology.cross_size
    several = runtime.topology.max_local_size > 1
    if runtime.config.server_host_reduce == "on":
        assert api._reduces_in_hosts(runtime, 4 * PART, None) == several
    else:  # auto, on hosts of several workers with the servers on hosts of their own: the cost model's choice
        assert api._reduces_in_hosts(runtime, 4 * (3 * PART + 7), None) == several
    client = runtime.servers
    pushed = []
    original = client.push_pull_async

    def counting(buf, key, *args, **kwargs):
        pushed.append(buf.size)
        return original(buf, key, *args, **kwargs)

    client.push_pull_async = counting
    try:
        for n in (0, 1, size + 1, 3 * PART + 7):
            for op in (cl.Sum, cl.Average):
                x = data(np.float32, n, rank, salt=n)
                expect = sum(data(np.float32, n, r, salt=n).astype(np.float64) for r in range(size))
                expect = expect / (size if op is cl.Average else 1)
                del pushed[:]
                got = cl.push_pull(x, op=op, name=f"h.{n}.{op.name}")
                assert np.allclose(got, expect, rtol=1e-6, atol=1e-6), (n, got[:4], expect[:4])
                same_on_every_worker(got, f"h.{n}.{op.name}")
                # the elements this worker pushed, summed over the workers: the tensor once per host
                total = cl.allreduce(np.array([sum(pushed)], np.int64), op=cl.Sum, name=f"h.count.{n}.{op.name}",
                                     algorithm="ring")
                pushers = hosts if api._reduces_in_hosts(runtime, 4 * n, None) else size
                assert int(total[0]) == n * pushers, (n, int(total[0]), pushers)
    finally:
        client.push_pull_async = original
    # a contributor count declared differently (2 on worker 0, every worker on the others) is refused on
    # every worker, naming both declarations (the refused round waits for the most contributors declared)
    try:
        handle = client.push_pull_async(np.ones(5, np.float32), "h.contributors", contributors=2 if rank == 0 else size)
        client.wait(handle)
        handle.result()
    except ServerError as exc:
        assert "h.contributors" in str(exc) and "declare every key alike" in str(exc), str(exc)
        print(f"contributors mismatch refused on worker {rank}: {exc}", flush=True)
    else:
        raise AssertionError("a contributor count declared differently was accepted")
    cl.barrier()
    assert np.all(cl.push_pull(np.ones(7, np.float32), op=cl.Sum, name="h.after") == size)


@spmd.case
def lossy():
    # lossy encoders through the servers: each worker pushes its encoded partitions, the servers decode
    # and sum in float32, every worker receives the dense sum. Integer values keep every sum exact.
    from commlib import api
    from commlib.server import protocol
    from commlib.errors import CommlibError

    servers = cl.num_servers()
    n = 3 * PART // 4 * 5 + 3  # several partitions of a few hundred elements

    def bounds(count):
        """The partitions push_pull encodes one by one (protocol.bounds: tapered at both ends)."""
        b = protocol.bounds(count, 4, PART, servers, depth=api._rt().servers.depth)
        return list(zip(b[:-1], b[1:]))

    def distinct(r, step):
        """Distinct magnitudes (no ties for top-k), signs varying, different on every worker and step."""
        rng = np.random.default_rng(1000 * r + step)
        return ((rng.permutation(n) + 1) * np.where(rng.random(n) < 0.5, -1, 1)).astype(np.float32)

    def topk_numpy(x, residual, ratio):
        """What top-k with error feedback sends per partition (numpy), and the new residual."""
        flat = x + residual
        sent = np.zeros_like(flat)
        for lo, hi in bounds(flat.size):
            k = min(hi - lo, max(1, int(np.ceil(ratio * (hi - lo)))))
            idx = lo + np.argsort(-np.abs(flat[lo:hi]), kind="stable")[:k]
            if 2 * k >= hi - lo:
                sent[lo:hi] = flat[lo:hi]
            else:
                sent[idx] = flat[idx]
        return sent, flat - sent

    for via in ("push_pull", "allreduce"):
        c = cl.Compression.topk(0.1, min_elements=16)
        residuals = {op: [np.zeros(n, np.float32) for _ in range(size)] for op in (cl.Sum, cl.Average)}
        for step in range(3):
            for op in (cl.Sum, cl.Average):
                key = f"l.topk.{via}.{op.name}"
                x = distinct(rank, step * 2 + (op is cl.Average))
                if via == "push_pull":
                    got = cl.push_pull(x, op=op, name=key, compression=c)
                else:
                    got = cl.allreduce(x, op=op, name=key, compression=c, algorithm="ps")
                want = np.zeros(n, np.float64)
                for r in range(size):
                    sent, residuals[op][r] = topk_numpy(distinct(r, step * 2 + (op is cl.Average)),
                                                        residuals[op][r], 0.1)
                    want += sent
                if op is cl.Average:
                    assert np.allclose(got, want / size, rtol=1e-6), (via, step, np.abs(got - want / size).max())
                else:
                    assert np.array_equal(got, want), (via, step, np.abs(got - want).max())
                same_on_every_worker(got, key)
    # one-bit with error feedback: signs times the mean magnitude (a power of two per worker: exact sums)
    c = cl.Compression.onebit(min_elements=16)
    signs = np.where(np.random.default_rng(rank).random(n) < 0.5, -1.0, 1.0).astype(np.float32)
    got = cl.push_pull(signs * np.float32(2.0 ** rank), op=cl.Sum, name="l.onebit", compression=c)
    want = sum(np.where(np.random.default_rng(r).random(n) < 0.5, -1.0, 1.0) * 2.0 ** r for r in range(size))
    assert np.array_equal(got, want), np.abs(got - want).max()
    same_on_every_worker(got, "l.onebit")
    # small tensors (below min_elements) travel dense, exactly
    x = data(np.float32, 10, rank)
    got = cl.push_pull(x, op=cl.Sum, name="l.small", compression=cl.Compression.topk(0.01))
    assert np.array_equal(got, sum(data(np.float32, 10, r) for r in range(size)))
    # where a compressor does not apply: a clear error, naming it and what to use instead
    for what, call in (
            ("powersgd", lambda: cl.push_pull(np.ones(4096, np.float32), name="l.p", compression=cl.Compression.powersgd())),
            ("dgc", lambda: cl.allreduce(np.ones(4096, np.float32), name="l.d", compression=cl.Compression.dgc(),
                                         algorithm="ps")),
            ("float64", lambda: cl.push_pull(np.ones(4096), name="l.f", compression=cl.Compression.topk(0.1))),
            ("max", lambda: cl.push_pull(np.ones(4096, np.float32), op=cl.Max, name="l.m",
                                         compression=cl.Compression.onebit()))):
        try:
            call()
        except CommlibError as exc:
            assert ("does not apply to summation servers" in str(exc) if what in ("powersgd", "dgc")
                    else "float32" in str(exc) or "Sum or Average" in str(exc)), (what, str(exc))
        else:
            raise AssertionError(f"{what} through the servers was accepted")
    # a worker compressing a key that the others push dense: the server refuses the round on every worker
    # (where dense pushes go straight to the servers: reduced inside hosts first, they meet in negotiation)
    from commlib import api

    if size >= 2 and not api._reduces_in_hosts(api._rt(), 4096 * 4, None):
        try:
            cl.push_pull(np.ones(4096, np.float32), op=cl.Sum, name="l.mixed",
                         compression=cl.Compression.topk(0.1, min_elements=16) if rank == 0 else None)
        except ServerError as exc:
            assert "declare every key alike" in str(exc) and "compressed" in str(exc), str(exc)
        else:
            raise AssertionError("a key compressed on one worker only was accepted")


@spmd.case
def shutdown():
    cl.shutdown()


@spmd.case
def reinit():
    # init() after shutdown(): the servers serve the new runtime without a start-up exchange
    cl.init()
    assert np.all(cl.push_pull(np.ones(5, np.int64), op=cl.Sum, name="again") == size)
    cl.shutdown()


if __name__ == "__main__":
    asked = sys.argv[1].split(",")
    spmd.main(["init", *(c for c in spmd.names() if c in asked and c != "reinit"), "shutdown",
               *(["reinit"] if "reinit" in asked else [])])
