"""commlib.jax collectives on any number of ranks: eagerly, under jit, in scan/while_loop/cond bodies and
under vmap, against numpy; their gradients; named requests started in a different order on every rank;
a mismatch failing on every rank; the broadcast helpers.

Rank r's input is a known function of r, so every rank computes the expected result with numpy.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

import commlib.jax as cj
import spmd
from spmd import expect_error

DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16, jnp.int32, jnp.uint8]
SIZES = [0, 1, 2, 7, 1000]  # empty, one element, fewer than the ranks, not divisible, larger


def data(r, shape, dtype=np.float32):
    """Rank r's input: small integers (exact in every dtype and every sum and product below)."""
    n = int(np.prod(shape)) if shape else 1
    return ((np.arange(n) % 3) + r + 1).reshape(shape).astype(dtype)


def reference(shape, op, n):
    inputs = np.stack([data(q, shape, np.float64) for q in range(n)])
    return {cj.Sum: inputs.sum(0), cj.Average: inputs.mean(0), cj.Min: inputs.min(0), cj.Max: inputs.max(0),
            cj.Product: inputs.prod(0)}[op]


def close(actual, expected, what, tol=0.0):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert np.allclose(actual, expected, rtol=tol, atol=tol), f"{what}: {actual.ravel()[:6]} != {expected.ravel()[:6]}"


def check_allreduce(r, n):
    jitted = {}
    for dtype in DTYPES:
        floating = jnp.issubdtype(dtype, jnp.floating)
        ops = [cj.Sum, cj.Min, cj.Max, cj.Product] + ([cj.Average] if floating else [])
        for op in ops:
            for size in SIZES:
                x = jnp.asarray(data(r, (size,), dtype))
                expected = reference((size,), op, n)
                tol = 1e-2 if dtype in (jnp.float16, jnp.bfloat16) and op is cj.Average else 0.0
                what = f"allreduce {jnp.dtype(dtype).name} {op.name} size {size}"
                eager = cj.allreduce(x, op=op, name=f"e.{what}")
                assert eager.dtype == x.dtype, what
                close(eager, expected, "eager " + what, tol)
                key = (op,)
                if key not in jitted:
                    jitted[key] = jax.jit(lambda x, op=op: cj.allreduce(x, op=op))
                close(jitted[key](x), expected, "jit " + what, tol)
    # prescale and postscale, fp16 and bf16 on the wire, under jit
    x = jnp.asarray(data(r, (33,)))
    f = jax.jit(lambda x: cj.allreduce(x, op=cj.Sum, prescale_factor=0.5, postscale_factor=3.0, name="scaled"))
    close(f(x), 1.5 * reference((33,), cj.Sum, n), "prescale/postscale", 1e-6)
    for codec in (cj.Compression.fp16, cj.Compression.bf16):
        g = jax.jit(lambda x, c=codec: cj.allreduce(x, compression=c, name=f"wire.{c.name}"))
        close(g(x), reference((33,), cj.Average, n), f"compression {codec.name}", 1e-2)


def check_grouped(r, n):
    tree = {"w": jnp.asarray(data(r, (4, 3))), "b": [jnp.asarray(data(r, (5,), np.int32)), jnp.zeros((0,))],
            "s": jnp.asarray(data(r, ()))}
    expected = {"w": reference((4, 3), cj.Sum, n), "b": [reference((5,), cj.Sum, n), np.zeros((0,))],
                "s": reference((), cj.Sum, n)}
    overlapped = lambda t, b, name: cj.overlapped_allreduce(t, name, op=cj.Sum, bucket_bytes=b)  # noqa: E731
    for how, fn in (("eager", lambda t: cj.grouped_allreduce(t, op=cj.Sum, name="grouped.eager")),
                    ("jit", jax.jit(lambda t: cj.grouped_allreduce(t, op=cj.Sum, name="grouped.jit"))),
                    # a bucket per array, buckets of 2 arrays (the 48-byte w closes one), one bucket
                    ("overlapped 1 B", jax.jit(lambda t: overlapped(t, 1, "ov.1"))),
                    ("overlapped 40 B", jax.jit(lambda t: overlapped(t, 40, "ov.40"))),
                    ("overlapped 4 MiB", jax.jit(lambda t: overlapped(t, 4 << 20, "ov.4M"))),
                    ("overlapped eager", lambda t: overlapped(t, 1, "ov.eager"))):
        out = fn(tree)
        assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(tree), how
        jax.tree_util.tree_map(lambda a, e: close(a, e, f"grouped {how}"), out, expected)
        assert out["b"][0].dtype == jnp.int32
    # the Keras plug-in's form: a list in, a list out, Average
    xs = [jnp.asarray(data(r, (3,))), jnp.asarray(data(r, (2, 2)))]
    out = jax.jit(lambda xs: cj.grouped_allreduce(xs, op=cj.Average, name="keras.grads"))(xs)
    assert isinstance(out, list) and len(out) == 2
    close(out[1], reference((2, 2), cj.Average, n), "grouped list")
    assert cj.grouped_allreduce([]) == []


def check_other_collectives(r, n):
    # allgather: any first dimension eagerly, the same one under jit
    x = jnp.asarray(data(r, (r + 1, 2)))
    expected = np.concatenate([data(q, (q + 1, 2)) for q in range(n)])
    close(cj.allgather(x, name="gather.uneven"), expected, "allgather eager uneven")
    for rows in (0, 1, 3):
        y = jnp.asarray(data(r, (rows, 2), np.int32))
        out = jax.jit(lambda y: cj.allgather(y))(y)
        close(out, np.concatenate([data(q, (rows, 2)) for q in range(n)]), f"allgather jit {rows}")
    # reducescatter: uneven rows, earlier ranks take the extras
    for rows in (1, 5, 7):
        y = jnp.asarray(data(r, (rows, 3)))
        full = reference((rows, 3), cj.Sum, n)
        lo = sum(rows // n + (q < rows % n) for q in range(r))
        mine = full[lo:lo + rows // n + (r < rows % n)]
        close(jax.jit(lambda y: cj.reducescatter(y, op=cj.Sum))(y), mine, f"reducescatter jit {rows}")
        close(cj.reducescatter(y, op=cj.Average), mine / n, f"reducescatter eager {rows}", 1e-6)
    # broadcast from every root
    for root in range(n):
        y = jnp.asarray(data(r, (6,), np.uint8))
        close(jax.jit(lambda y, root=root: cj.broadcast(y, root))(y), data(root, (6,)), f"broadcast {root}")
        close(cj.broadcast(y, root), data(root, (6,)), f"broadcast eager {root}")
    # alltoall: equal parts under jit, any splits eagerly
    y = jnp.arange(2 * n, dtype=jnp.float32) + 100 * r
    expected = np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * q for q in range(n)])
    close(jax.jit(lambda y: cj.alltoall(y))(y), expected, "alltoall jit")
    splits = [q + 1 for q in range(n)]  # rank q receives q + 1 rows from everyone
    y = jnp.asarray(np.full((sum(splits), 2), r, np.float32))
    out, received = cj.alltoall(y, splits=splits, name="alltoall.splits")
    close(out, np.concatenate([np.full((r + 1, 2), q) for q in range(n)]), "alltoall splits")
    close(received, np.full(n, r + 1), "alltoall received splits")
    if n > 1:
        expect_error(ValueError, "does not split equally", lambda: cj.alltoall(jnp.ones(2 * n + 1)), "alltoall")
    jax.jit(lambda: cj.barrier())()
    cj.barrier()


def check_control_flow(r, n):
    x = jnp.asarray(data(r, (5,)))

    def body(c, _):
        return cj.allreduce(c, op=cj.Sum, name="scan.body") / n, None

    scanned = jax.jit(lambda x: jax.lax.scan(body, x, None, length=3)[0])(x)
    close(scanned, reference((5,), cj.Average, n), "scan", 1e-6)

    def loop(state):
        i, c = state
        return i + 1, cj.allreduce(c, op=cj.Max, name="while.body") + 1

    i, looped = jax.jit(lambda x: jax.lax.while_loop(lambda s: s[0] < 4, loop, (0, x)))(x)
    close(looped, reference((5,), cj.Max, n) + 4, "while_loop")
    branch = jax.jit(lambda x, p: jax.lax.cond(p, lambda x: cj.allreduce(x, op=cj.Sum), lambda x: x, x))
    close(branch(x, True), reference((5,), cj.Sum, n), "cond taken")
    close(branch(x, False), x, "cond not taken")
    # vmap: the batch is one more axis of what every rank contributes
    xb = jnp.stack([x, 2 * x])
    close(jax.vmap(lambda x: cj.allreduce(x, op=cj.Sum))(xb), np.stack([reference((5,), cj.Sum, n)] * 2)
          * np.array([[1], [2]]), "vmap allreduce")
    gathered = jax.jit(jax.vmap(lambda x: cj.allgather(x[None])))(xb)
    assert gathered.shape == (2, n, 5), gathered.shape
    close(gathered[1], 2 * np.stack([data(q, (5,)) for q in range(n)]), "vmap allgather")


def check_gradients(r, n):
    x = jnp.asarray(data(r, (6,)))
    w = jnp.arange(6, dtype=jnp.float32) + r  # each rank's loss weights its output differently
    ws = np.stack([np.arange(6) + q for q in range(n)])

    def grad(fn):
        return jax.jit(jax.grad(lambda x: jnp.sum(w * fn(x))))(x)

    close(grad(lambda x: cj.allreduce(x, op=cj.Sum)), ws.sum(0), "grad allreduce Sum")
    close(grad(lambda x: cj.allreduce(x, op=cj.Average)), ws.mean(0), "grad allreduce Average", 1e-6)
    close(grad(lambda x: cj.allreduce(x, op=cj.Sum, prescale_factor=2.0, postscale_factor=0.5)), ws.sum(0),
          "grad allreduce scaled")
    close(grad(lambda x: cj.grouped_allreduce({"a": x}, op=cj.Sum)["a"]), ws.sum(0), "grad grouped")
    close(grad(lambda x: cj.broadcast(x, 0)), ws.sum(0) if r == 0 else np.zeros(6), "grad broadcast")
    # allgather: rank q's slice of every rank's weights lands on q
    wg = jnp.arange(6 * n, dtype=jnp.float32) * (r + 1)
    gg = jax.jit(jax.grad(lambda x: jnp.sum(wg * cj.allgather(x))))(x)
    full = sum(np.arange(6 * n) * (q + 1) for q in range(n))
    close(gg, full[6 * r:6 * r + 6], "grad allgather")
    # reducescatter of n*2 rows: the gradient is every rank's weight for its block
    y = jnp.asarray(data(r, (2 * n,)))
    wr = jnp.asarray([r + 1.0, r + 2.0])
    gr = jax.jit(jax.grad(lambda y: jnp.sum(wr * cj.reducescatter(y, op=cj.Average))))(y)
    close(gr, np.concatenate([[q + 1.0, q + 2.0] for q in range(n)]) / n, "grad reducescatter", 1e-6)
    # alltoall: the gradient sends the cotangents back where the rows came from
    wa = jnp.arange(2 * n, dtype=jnp.float32) + 10 * r
    ga = jax.jit(jax.grad(lambda y: jnp.sum(wa * cj.alltoall(y))))(y)
    close(ga, np.concatenate([[2 * r + 10 * q, 2 * r + 1 + 10 * q] for q in range(n)]), "grad alltoall")
    expect_error(TypeError, "op=MAX has no gradient", lambda: grad(lambda x: cj.allreduce(x, op=cj.Max)),
                 "grad of Max")


def check_order_and_errors(r, n):
    # Named requests started in a different order on every rank, each in its own jitted function.
    a, b = jnp.asarray(data(r, (4,))), jnp.asarray(data(r, (7,)))

    def forward(a, b):
        ha = cj.allreduce_async(a, op=cj.Sum, name="order.a")
        hb = cj.allreduce_async(b, op=cj.Sum, name="order.b")
        return cj.synchronize(ha), cj.synchronize(hb)

    fn = jax.jit(forward) if r % 2 == 0 else jax.jit(lambda a, b: _reversed(a, b))
    for _ in range(3):
        out_a, out_b = fn(a, b)
        close(out_a, reference((4,), cj.Sum, n), "different order a")
        close(out_b, reference((7,), cj.Sum, n), "different order b")
    out_a, out_b = forward(a, b) if r % 2 else _reversed(a, b)  # eagerly too, the other way round
    close(out_a, reference((4,), cj.Sum, n), "eager different order")

    # A shape that differs between ranks fails on every rank, naming the tensor; commlib keeps working.
    if n > 1:
        bad = jax.jit(lambda x: cj.allreduce(x, name="mismatched.shape"))
        expect_error(Exception, "mismatched.shape", lambda: bad(jnp.ones(3 + r)).block_until_ready(),
                     "mismatched shape under jit")
        expect_error(Exception, "same first dimension",
                     lambda: jax.jit(lambda x: cj.allgather(x, name="uneven.jit"))(jnp.ones((1 + r, 2)))
                     .block_until_ready(), "uneven allgather under jit")
    close(jax.jit(lambda x: cj.allreduce(x, op=cj.Sum, name="after.errors"))(a), reference((4,), cj.Sum, n),
          "allreduce after errors")


def _reversed(a, b):
    hb = cj.allreduce_async(b, op=cj.Sum, name="order.b")
    ha = cj.allreduce_async(a, op=cj.Sum, name="order.a")
    out_b = cj.synchronize(hb)
    return cj.synchronize(ha), out_b


def check_helpers(r, n):
    params = {"dense": {"kernel": jnp.full((3, 2), float(r)), "bias": jnp.arange(2) + r}, "step": r}
    out = cj.broadcast_parameters(params, root_rank=n - 1)
    close(out["dense"]["kernel"], np.full((3, 2), n - 1.0), "broadcast_parameters")
    assert out["dense"]["bias"].dtype == params["dense"]["bias"].dtype and out["step"] == n - 1
    assert cj.broadcast_object({"epoch": r}, root_rank=0) == {"epoch": 0}
    assert cj.allgather_object(r) == list(range(n))
    if n >= 2:  # a process set of the first and last ranks (the last alone on 2 ranks)
        members = [0, n - 1] if n >= 3 else [n - 1]
        pair = cj.add_process_set(members)
        if r in members:
            out = jax.jit(lambda x: cj.allreduce(x, op=cj.Sum, process_set=pair, name="pair"))(jnp.ones(3) * r)
            close(out, np.full(3, float(sum(members))), "process set allreduce")
            close(jax.jit(lambda x: cj.allgather(x, process_set=pair))(jnp.ones(1) * r), members, "set allgather")
        cj.remove_process_set(pair)


CHECKS = (check_allreduce, check_grouped, check_other_collectives, check_control_flow, check_gradients,
          check_order_and_errors, check_helpers)


@spmd.case
def init():
    cj.init()
    assert 0 <= cj.local_rank() < cj.local_size()


spmd.rank_cases(lambda: (cj.rank(), cj.size()), *CHECKS)


@spmd.case
def shutdown():
    cj.shutdown()


if __name__ == "__main__":
    spmd.main()
