"""Worker for tests/torch/test_torch_backend.py: every torch.distributed call on one backend, each call
recorded with its result, which every rank checks against a reference it computes itself (every rank's
input is a function of the rank, so each rank knows them all).

    python torch_backend_ops.py BACKEND OUT        (under mpiexec or on an emulated cluster)

BACKEND is ``commlib`` or ``gloo``. The named cases (tests/spmd.py) are the kinds of call (all_reduce,
reduce, reduce_scatter, ...); a call that fails or differs from its reference does not fail its case (gloo
refuses some calls): it is recorded, and ``save`` writes ``OUT.RANK.pt``: {call: {"value": what the call
produced, "error": "Type: message" or None, "ok": whether it matched the reference, "why": what
differed}}. The test reads both backends' files: commlib must pass every call (or refuse it as gloo does),
and give gloo's values wherever gloo has one.
"""

from __future__ import annotations

import sys
import traceback

import torch
import torch.distributed as dist

import commlib.torch  # noqa: F401 - registers the backend and the MPI rendezvous (gloo too)
import spmd

RedOp = dist.ReduceOp
OPS = {"SUM": RedOp.SUM, "AVG": RedOp.AVG, "PRODUCT": RedOp.PRODUCT, "MIN": RedOp.MIN, "MAX": RedOp.MAX,
       "BAND": RedOp.BAND, "BOR": RedOp.BOR, "BXOR": RedOp.BXOR}
REDUCE_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
                 torch.uint8, torch.int8, torch.bool]
MOVE_DTYPES = [torch.float32, torch.float64, torch.int16, torch.bfloat16, torch.complex64, torch.bool]

backend, out = sys.argv[1], sys.argv[2]
RANK, SIZE = spmd.rank_and_size()
results: dict[str, dict] = {}


def value(rank: int, n: int, dtype: torch.dtype, op: str = "SUM", salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input: small values every dtype holds exactly (products stay in {1, 2}^ranks)."""
    i = torch.arange(n, dtype=torch.int64) + salt
    if dtype is torch.bool:
        return (i + rank) % 3 == 0
    if op == "PRODUCT":
        base = 1 + (i + rank) % 2
    elif dtype in (torch.uint8,) or op in ("BAND", "BOR", "BXOR"):
        base = (rank + 1) * (i % 5) + (i % 3)
    else:
        base = (rank + 1) * (i % 5) - 2 * (i % 3)
    if dtype.is_floating_point:
        return (base.to(torch.float64) / 4).to(dtype)
    if dtype.is_complex:
        return torch.complex(base.float(), -base.float()).to(dtype)
    return base.to(dtype)


def reduced(tensors: list[torch.Tensor], op: str, factor: float = 1.0) -> torch.Tensor:
    """The reference reduction of every rank's tensor."""
    dtype = tensors[0].dtype
    if dtype is torch.bool:
        stack = torch.stack(tensors)
        return stack.all(0) if op in ("PRODUCT", "MIN", "BAND") else (
            (stack.sum(0) % 2 == 1) if op == "BXOR" else stack.any(0))
    if op in ("BAND", "BOR", "BXOR"):
        fn = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
        result = tensors[0].clone()
        for t in tensors[1:]:
            result = fn(result, t)
        return result
    wide = torch.stack([t.to(torch.float64) for t in tensors])
    if op in ("SUM", "PREMUL_SUM"):
        result = (wide * factor).sum(0)
    elif op == "AVG":
        result = wide.sum(0) / len(tensors)
        if not dtype.is_floating_point:
            result = torch.trunc(result)  # commlib's (Horovod's) integer average: truncated toward zero
    elif op == "PRODUCT":
        result = wide.prod(0)
    elif op == "MIN":
        result = wide.min(0).values
    else:
        result = wide.max(0).values
    return result.to(dtype)


def same(got, want) -> str:
    """'' if ``got`` equals ``want`` (tolerance for floating types), else what differs."""
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return f"expected {len(want)} items, got {got!r}"[:300]
        for k, (g, w) in enumerate(zip(got, want)):
            why = same(g, w)
            if why:
                return f"item {k}: {why}"
        return ""
    if not isinstance(want, torch.Tensor):
        return "" if got == want else f"expected {want!r}, got {got!r}"[:300]
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"expected {want.dtype}{tuple(want.shape)}, got {got.dtype}{tuple(got.shape)}"
    if want.dtype.is_floating_point or want.dtype.is_complex:
        tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(want.dtype, 1e-5)
        ok = torch.allclose(got.to(torch.complex128 if want.dtype.is_complex else torch.float64),
                            want.to(torch.complex128 if want.dtype.is_complex else torch.float64), rtol=tol, atol=tol)
    else:
        ok = torch.equal(got, want)
    return "" if ok else f"expected {want.flatten()[:8].tolist()}, got {got.flatten()[:8].tolist()}"


def record(name: str, run, expected=None) -> None:
    """Run ``run()`` (returning the result) and record it against ``expected`` (a value, or a function of
    nothing that returns it; None: only that it completes)."""
    try:
        got = run()
        want = expected() if callable(expected) else expected
        why = "" if want is None else same(got, want)
        results[name] = {"value": got, "error": None, "ok": not why, "why": why}
    except Exception as exc:  # noqa: BLE001 - recorded: the test decides whether this backend may refuse it
        results[name] = {"value": None, "error": f"{type(exc).__name__}: {exc}"[:500], "ok": False,
                         "why": traceback.format_exc(limit=3)[-800:]}


def sizes() -> list[int]:
    return sorted({0, 1, max(SIZE - 1, 1), 7, 1000})


@spmd.case
def init():
    dist.init_process_group(backend)
    assert (dist.get_rank(), dist.get_world_size()) == (RANK, SIZE)


# ---- reductions -------------------------------------------------------------------------------------------

@spmd.case
def all_reduce():
    for op in [*OPS, "PREMUL_SUM"]:
        for dtype in REDUCE_DTYPES:
            for n in sizes():
                label = f"all_reduce/{op}/{str(dtype)[6:]}/n{n}"
                source = "SUM" if op == "PREMUL_SUM" else op

                def run(op=op, dtype=dtype, n=n, source=source):
                    t = value(RANK, n, dtype, source)
                    redop = dist._make_nccl_premul_sum(2.0) if op == "PREMUL_SUM" else OPS[op]
                    dist.all_reduce(t, op=redop)
                    return t

                record(label, run, lambda op=op, dtype=dtype, n=n, source=source: reduced(
                      [value(r, n, dtype, source) for r in range(SIZE)], op, 2.0 if op == "PREMUL_SUM" else 1.0))


def _async(tensors, op, group=None):
    """Start every all_reduce, then wait for them all."""
    works = [dist.all_reduce(t, op=op, group=group, async_op=True) for t in tensors]
    for work in works:
        work.wait()
    return tensors


@spmd.case
def all_reduce_async():
    for n in (0, 7, 1000):
        record(f"all_reduce_async_many/n{n}", lambda n=n: _async([value(RANK, n, torch.float32, salt=k) for k in range(12)],
                                                                RedOp.SUM),
               lambda n=n: [reduced([value(r, n, torch.float32, salt=k) for r in range(SIZE)], "SUM") for k in range(12)])
        record(f"all_reduce_complex/n{n}", lambda n=n: _async([value(RANK, n, torch.complex64)], RedOp.SUM),
               lambda n=n: [sum(value(r, n, torch.complex64) for r in range(SIZE))])


@spmd.case
def reduce():
    for root in range(SIZE):
        for op in ("SUM", "MAX", "PRODUCT", "BOR"):
            for dtype in (torch.float32, torch.int64):
                for n in (0, 1, 7, 1000):
                    if op == "BOR" and dtype.is_floating_point:
                        continue

                    def run_reduce(root=root, op=op, dtype=dtype, n=n):
                        t = value(RANK, n, dtype, op)
                        dist.reduce(t, dst=root, op=OPS[op])
                        return t if RANK == root else None

                    record(f"reduce/root{root}/{op}/{str(dtype)[6:]}/n{n}", run_reduce,
                           (lambda root=root, op=op, dtype=dtype, n=n: reduced([value(r, n, dtype, op) for r in range(SIZE)], op)
                            if RANK == root else None))


@spmd.case
def reduce_scatter():
    for op in [*OPS, "PREMUL_SUM"]:
        for dtype in (torch.float32, torch.float16, torch.int32, torch.uint8):
            for n in (0, 1, 7, 300):
                source = "SUM" if op == "PREMUL_SUM" else op
                redop = (lambda: dist._make_nccl_premul_sum(2.0)) if op == "PREMUL_SUM" else (lambda op=op: OPS[op])
                factor = 2.0 if op == "PREMUL_SUM" else 1.0

                def want(op=op, dtype=dtype, n=n, source=source, factor=factor):
                    blocks = [torch.stack([value(r, n, dtype, source, salt=100 * b) for b in range(SIZE)]) for r in range(SIZE)]
                    return reduced(blocks, op, factor)[RANK]

                def run_rs_list(dtype=dtype, n=n, source=source, redop=redop):
                    out_t = torch.zeros(n, dtype=dtype)
                    dist.reduce_scatter(out_t, [value(RANK, n, dtype, source, salt=100 * b) for b in range(SIZE)], op=redop())
                    return out_t

                def run_rs_tensor(dtype=dtype, n=n, source=source, redop=redop):
                    out_t = torch.zeros(n, dtype=dtype)
                    whole = torch.cat([value(RANK, n, dtype, source, salt=100 * b) for b in range(SIZE)])
                    dist.reduce_scatter_tensor(out_t, whole, op=redop())
                    return out_t

                record(f"reduce_scatter/{op}/{str(dtype)[6:]}/n{n}", run_rs_list, want)
                record(f"reduce_scatter_tensor/{op}/{str(dtype)[6:]}/n{n}", run_rs_tensor, want)


# ---- data movement ----------------------------------------------------------------------------------------

@spmd.case
def broadcast_gather_scatter():
    for dtype in MOVE_DTYPES:
        for n in sizes():
            for root in range(SIZE):
                def run_bcast(dtype=dtype, n=n, root=root):
                    t = value(RANK, n, dtype)
                    dist.broadcast(t, src=root)
                    return t

                record(f"broadcast/root{root}/{str(dtype)[6:]}/n{n}", run_bcast, lambda dtype=dtype, n=n, root=root: value(root, n, dtype))

            def run_gather_list(dtype=dtype, n=n):
                outs = [torch.empty(n, dtype=dtype) for _ in range(SIZE)]
                dist.all_gather(outs, value(RANK, n, dtype))
                return outs

            def run_gather_tensor(dtype=dtype, n=n):
                whole = torch.empty(SIZE * n, dtype=dtype)
                dist.all_gather_into_tensor(whole, value(RANK, n, dtype))
                return whole

            record(f"all_gather/{str(dtype)[6:]}/n{n}", run_gather_list, lambda dtype=dtype, n=n: [value(r, n, dtype) for r in range(SIZE)])
            record(f"all_gather_into_tensor/{str(dtype)[6:]}/n{n}", run_gather_tensor,
                   lambda dtype=dtype, n=n: torch.cat([value(r, n, dtype) for r in range(SIZE)]))

            for root in range(SIZE):
                def run_gather(dtype=dtype, n=n, root=root):
                    outs = [torch.empty(n, dtype=dtype) for _ in range(SIZE)] if RANK == root else None
                    dist.gather(value(RANK, n, dtype), outs, dst=root)
                    return outs

                def run_scatter(dtype=dtype, n=n, root=root):
                    t = torch.empty(n, dtype=dtype)
                    pieces = [value(root, n, dtype, salt=10 * r) for r in range(SIZE)] if RANK == root else None
                    dist.scatter(t, pieces, src=root)
                    return t

                record(f"gather/root{root}/{str(dtype)[6:]}/n{n}", run_gather,
                       lambda dtype=dtype, n=n, root=root: [value(r, n, dtype) for r in range(SIZE)] if RANK == root else None)
                record(f"scatter/root{root}/{str(dtype)[6:]}/n{n}", run_scatter,
                       lambda dtype=dtype, n=n, root=root: value(root, n, dtype, salt=10 * RANK))



def rows(src: int, dst: int) -> int:
    """How many rows ``src`` sends ``dst`` in the uneven all-to-all cases (some zero)."""
    return (src + 2 * dst) % 3


@spmd.case
def all_to_all():
    for dtype in (torch.float32, torch.int64, torch.complex64):
        width = 3

        def block(src, dst, dtype=dtype):
            return value(src, rows(src, dst) * width, dtype, salt=7 * dst).reshape(-1, width)

        def run_a2a_list(dtype=dtype):
            outs = [torch.empty(rows(s, RANK), width, dtype=dtype) for s in range(SIZE)]
            dist.all_to_all(outs, [block(RANK, d) for d in range(SIZE)])
            return outs

        def run_a2a_uneven(dtype=dtype):
            inp = torch.cat([block(RANK, d) for d in range(SIZE)])
            out_t = torch.empty(sum(rows(s, RANK) for s in range(SIZE)), width, dtype=dtype)
            dist.all_to_all_single(out_t, inp, [rows(s, RANK) for s in range(SIZE)], [rows(RANK, d) for d in range(SIZE)])
            return out_t

        def run_a2a_even(dtype=dtype):
            inp = value(RANK, 2 * SIZE * width, dtype).reshape(2 * SIZE, width)
            out_t = torch.empty_like(inp)
            dist.all_to_all_single(out_t, inp)
            return out_t

        record(f"all_to_all/{str(dtype)[6:]}", run_a2a_list, lambda: [block(s, RANK) for s in range(SIZE)])
        record(f"all_to_all_single_uneven/{str(dtype)[6:]}", run_a2a_uneven, lambda: torch.cat([block(s, RANK) for s in range(SIZE)]))
        record(f"all_to_all_single_even/{str(dtype)[6:]}", run_a2a_even,
               lambda dtype=dtype: torch.cat([value(s, 2 * SIZE * width, dtype).reshape(2 * SIZE, width)[2 * RANK:2 * RANK + 2]
                                              for s in range(SIZE)]))



@spmd.case
def barrier():
    record("barrier", lambda: dist.barrier())


def gather_coalesced():
    outs = [[torch.empty(4), torch.empty(0, dtype=torch.int64), torch.empty(7, dtype=torch.int64)] for _ in range(SIZE)]
    dist.all_gather_coalesced(outs, [value(RANK, 4, torch.float32), value(RANK, 0, torch.int64),
                                     value(RANK, 7, torch.int64)])
    return outs


@spmd.case
def all_gather_coalesced():
    record("all_gather_coalesced", gather_coalesced,
           lambda: [[value(r, 4, torch.float32), value(r, 0, torch.int64), value(r, 7, torch.int64)] for r in range(SIZE)])


# ---- point to point ---------------------------------------------------------------------------------------

@spmd.case
def point_to_point():
    if SIZE == 1:
        spmd.skip("needs 2 ranks")
    nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE

    def ring_blocking():
        got = torch.empty(5)
        if RANK % 2 == 0:
            dist.send(value(RANK, 5, torch.float32), nxt)
            dist.recv(got, prv)
        else:
            dist.recv(got, prv)
            dist.send(value(RANK, 5, torch.float32), nxt)
        return got

    def ring_async():
        got = torch.empty(6, dtype=torch.int64)
        works = [dist.irecv(got, prv, tag=3), dist.isend(value(RANK, 6, torch.int64), nxt, tag=3)]
        for work in works:
            work.wait()
        return got

    def ring_batch():
        got = torch.empty(4, dtype=torch.float64)
        ops = [dist.P2POp(dist.isend, value(RANK, 4, torch.float64), nxt), dist.P2POp(dist.irecv, got, prv)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return got

    def any_source():
        if RANK == 0:
            senders = []
            for _ in range(SIZE - 1):
                got = torch.empty(2)
                sender = dist.recv(got)
                senders.append((sender, got[0].item()))
            return sorted(senders)
        dist.send(torch.full((2,), float(RANK)), 0)
        return None

    record("send_recv_ring", ring_blocking, lambda: value(prv, 5, torch.float32))
    record("isend_irecv_ring", ring_async, lambda: value(prv, 6, torch.int64))
    record("batch_isend_irecv_ring", ring_batch, lambda: value(prv, 4, torch.float64))
    record("recv_any_source", any_source, lambda: [(r, float(r)) for r in range(1, SIZE)] if RANK == 0 else None)


# ---- objects ------------------------------------------------------------------------------------------------

def objects():
    made = {"rank": RANK, "data": list(range(RANK + 1)), "text": "x" * (RANK * 1000)}
    everyone = [None] * SIZE
    dist.all_gather_object(everyone, made)
    box = [made if RANK == SIZE - 1 else None]
    dist.broadcast_object_list(box, src=SIZE - 1)
    gathered = [None] * SIZE if RANK == 0 else None
    dist.gather_object(made, gathered, dst=0)
    got = [None]
    dist.scatter_object_list(got, [{"to": r} for r in range(SIZE)] if RANK == 0 else None, src=0)
    return [everyone, box[0], gathered, got[0]]


def objects_expected():
    made = [{"rank": r, "data": list(range(r + 1)), "text": "x" * (r * 1000)} for r in range(SIZE)]
    return [made, made[SIZE - 1], made if RANK == 0 else None, {"to": RANK}]


@spmd.case
def objects_everywhere():
    record("objects", objects, objects_expected)


# ---- subgroups ------------------------------------------------------------------------------------------------

@spmd.case
def subgroups():
    if SIZE == 1:
        spmd.skip("needs 2 ranks")
    members = list(range(1, SIZE)) if SIZE > 2 else [0, 1]
    group = dist.new_group(members)
    again = dist.new_group(members)  # a second group of the same ranks: its own calls, commlib's set shared
    if RANK in members:
        record("subgroup", *_calls_in(group, members))
        record("subgroup_same_ranks", *_calls_in(again, members))
    if SIZE % 2 == 0:
        mine, _ = dist.new_subgroups(group_size=2)
        pair = [RANK - RANK % 2, RANK - RANK % 2 + 1]
        record("new_subgroups", lambda: _async([value(RANK, 5, torch.float32)], RedOp.SUM, mine)[0],
               lambda: reduced([value(r, 5, torch.float32) for r in pair], "SUM"))


def _calls_in(group, members: list[int]):
    """all_reduce, broadcast (from the last member) and all_gather on ``group``, with their references."""
    def run():
        t = value(RANK, 9, torch.float32)
        dist.all_reduce(t, group=group)
        b = value(RANK, 4, torch.int64)
        dist.broadcast(b, src=members[-1], group=group)
        outs = [torch.empty(3) for _ in members]
        dist.all_gather(outs, value(RANK, 3, torch.float32), group=group)
        return [t, b, outs]

    def expected():
        return [reduced([value(r, 9, torch.float32) for r in members], "SUM"), value(members[-1], 4, torch.int64),
                [value(r, 3, torch.float32) for r in members]]

    return run, expected


@spmd.case
def subgroups_made_by_their_members():
    """Groups whose creation only their members (or their parent group's ranks) call: new_subgroups(group=...)
    on each half of the ranks (as PyTorch's test_new_subgroups_with_group_param), and
    new_group(use_local_synchronization=True), made while the other ranks make their own."""
    if SIZE == 1:
        spmd.skip("needs 2 ranks")
    # first: c10d names these by a hash of the ranks and of how many groups this rank has, which is the same on
    # the members here (gloo meets its peers under that name), and not after the subgroups below
    local = list(range(1, SIZE)) if SIZE > 2 else [1]
    if RANK in local:
        group = dist.new_group(local, use_local_synchronization=True)
        record("new_group_local_synchronization", *_calls_in(group, local))
    else:
        group = dist.new_group([RANK], use_local_synchronization=True)
        record("new_group_local_synchronization", *_calls_in(group, [RANK]))
    halves = [list(range(0, SIZE, 2)), list(range(1, SIZE, 2))]
    half, _ = dist.new_subgroups_by_enumeration(halves)
    mine = halves[RANK % 2]
    single, singles = dist.new_subgroups(group_size=1, group=half)  # on this half's ranks only
    record("new_subgroups_of_a_group_size_1", lambda: [len(singles), single.size(),
                                                       _calls_in(single, [RANK])[0]()],
           lambda: [len(mine), 1, _calls_in(single, [RANK])[1]()])
    # c10d names these groups by a count of each rank's own calls, and gloo meets its peers under that name:
    # two halves' groups of several ranks would meet under the same name on gloo, so one half makes one
    if RANK % 2 == 0:
        whole, wholes = dist.new_subgroups(group_size=len(mine), group=half)
        record("new_subgroups_of_a_group", lambda: [len(wholes), *_calls_in(whole, mine)[0]()],
               lambda: [1, *_calls_in(whole, mine)[1]()])


@spmd.case
def save():
    dist.barrier()
    torch.save(results, f"{out}.{RANK}.pt")
    failed = [name for name, r in results.items() if not r["ok"]]
    print(f"rank {RANK} {backend}: {len(results) - len(failed)} of {len(results)} calls match their reference", flush=True)


@spmd.case
def shutdown():
    dist.destroy_process_group()


if __name__ == "__main__":
    spmd.main()
