"""Geo-SGD through summation servers (docs/servers.md). argv[1]: comma-separated cases.

- ``exact``: k=1, staleness 0, deltas summed: after round r every worker holds exactly the initial values
  plus every worker's deltas of rounds 1..r (small integers: any order of addition gives the same bits);
  a tensor spanning several partitions and servers; worker 0's initial values win;
- ``unbounded``: staleness None, overlap: after a barrier, ``pull()`` gives the initial values plus every
  delta pushed, on every worker;
- ``bound``: staleness 1, the last worker slow: when a worker's round r is answered, the slow worker's
  pushes merged so far (read from the values: each worker adds 1 to its own element per round) are at
  least r - 1; with staleness None the fast workers finish without waiting;
- ``finish``: staleness 0, the workers stop after different numbers of rounds: nobody hangs, and the
  ones that go on are answered;
- ``average``: average=True divides each delta by the number of workers;
- ``stopped``: a server stops answering (SIGSTOP): every worker's next exchange fails within
  COMMLIB_SERVER_TIMEOUT, naming the server; then worker 0 kills it (which ends the job);
- ``mismatch``: parameters declared differently on one worker fail GeoSGD() on every worker, naming it;
- ``torch``: commlib.torch.GeoSGD trains a small linear regression, each worker on its own data, to a
  low loss.
Each a named case on every worker (tests/spmd.py), between init and shutdown (stopped ends the job).
"""

import os
import sys
import time

import numpy as np

import commlib as cl
import spmd
from commlib.geo import GeoSGD

#: far above COMMLIB_SERVER_TIMEOUT (3 s in the test) on any load: the bound is the feature (a stopped
#: server fails the workers instead of hanging them), not how fast a loaded machine says so
FAILS_WITHIN_S = 60.0
rank = size = victim = 0


@spmd.case
def init():
    global rank, size
    cl.init()
    rank, size = cl.rank(), cl.size()
    assert cl.num_servers() >= 1


def own_delta(r, n):
    """Worker ``rank``'s delta in round r: small integers, distinct per worker and round."""
    return ((np.arange(n) % 7) + rank + r).astype(np.float32)


@spmd.case
def exact():
    n = 5000  # several 4 KiB partitions over every server
    w = np.full(n, 100.0 + rank, np.float32)  # worker 0's 100.0 must win
    b = np.full((3, 2), -1.0 * rank, np.float32)
    geo = GeoSGD({"w": w, "b": b}, k=1, staleness=0, average=False, overlap=False, name="exact")
    assert np.all(w == 100.0) and np.all(b == 0.0), (w[:3], b)
    expect_w = np.full(n, 100.0, np.float32)
    for r in range(1, 6):
        w += own_delta(r, n)
        b += r
        geo.step()
        for q in range(size):
            expect_w += ((np.arange(n) % 7) + q + r).astype(np.float32)
        expect_b = np.full((3, 2), sum(range(1, r + 1)) * size, np.float32)
        assert np.array_equal(w, expect_w), (r, w[:5], expect_w[:5])
        assert np.array_equal(b, expect_b), (r, b, expect_b)
    geo.close()
    assert geo.rounds == 5


@spmd.case
def unbounded():
    n = 3000
    w = np.zeros(n, np.float32)
    geo = GeoSGD([w], k=2, staleness=None, average=False, name="unbounded")
    pushed = np.zeros(n, np.float32)
    for step in range(1, 9):
        d = own_delta(step, n)
        w += d
        pushed += d
        geo.step()
    geo.synchronize()
    cl.barrier()
    geo.pull()
    total = cl.allreduce(pushed, op=cl.Sum, name="unbounded.total")
    assert np.array_equal(w, total), (w[:5], total[:5])
    assert geo.rounds == 4
    cl.barrier()
    geo.close()


@spmd.case
def bound():
    slow = size - 1
    for staleness in (1, None):
        x = np.zeros(size, np.float64)
        geo = GeoSGD([x], k=1, staleness=staleness, average=False, overlap=False, name=f"bound{staleness}")
        rounds = 12
        lag = []
        for r in range(1, rounds + 1):
            if rank == slow:
                time.sleep(0.15)
            x[rank] += 1
            geo.step()
            assert x[rank] == r, (x, r)  # its own pushes are all merged
            lag.append(r - x[slow])
            if staleness is not None:
                assert x[slow] >= r - staleness, f"round {r} answered with the slow worker at {x[slow]}: {x}"
        geo.close()
        if staleness is None and rank != slow:
            # the slow worker needs 12 x 0.15 s; a fast worker that never waits ends far ahead of it
            assert max(lag) >= 4, f"unbounded staleness: fast worker {rank} stayed within {max(lag)} rounds"
        cl.barrier()
        print(f"bound {staleness}: worker {rank} lag at most {max(lag):g}", flush=True)


@spmd.case
def finish():
    x = np.zeros(size, np.float32)
    geo = GeoSGD([x], k=1, staleness=0, average=False, overlap=False, name="finish")
    mine = 3 + 4 * rank
    for r in range(1, mine + 1):  # a worker that hangs here runs the job past its timeout
        x[rank] += 1
        geo.step()
        for q in range(size):  # everyone still in has pushed this round (staleness 0)
            assert x[q] >= min(r, 3 + 4 * q), (r, x)
    geo.close()
    cl.barrier()


@spmd.case
def average():
    x = np.zeros(4, np.float32)
    geo = GeoSGD([x], k=1, staleness=0, overlap=False, name="average")
    x += 2.0 * size
    geo.step()
    assert np.allclose(x, 2.0 * size), x  # every worker added 2*size, each counted 1/size
    geo.close()


@spmd.case
def mismatch():
    x = np.zeros(10 + (rank == size - 1), np.float32)
    try:
        GeoSGD([x], name="mismatch")
    except cl.CommlibError as exc:
        assert "declares" in str(exc) and f"worker {size - 1}" in str(exc), str(exc)
    else:
        raise AssertionError("GeoSGD accepted parameters declared differently")
    assert np.all(cl.allreduce(np.ones(3, np.float32), op=cl.Sum, name="after.mismatch") == size)


@spmd.case
def torch():
    import torch

    import commlib.torch as hvd

    torch.manual_seed(1234)
    torch.set_num_threads(1)
    true_w = torch.arange(1.0, 9.0).reshape(8, 1) / 4
    gen = torch.Generator().manual_seed(rank)
    features = torch.randn(512, 8, generator=gen)
    targets = features @ true_w + 0.5
    model = torch.nn.Linear(8, 1)
    if rank:
        with torch.no_grad():
            model.weight.add_(rank)  # worker 0's parameters are broadcast at creation
    opt = hvd.GeoSGD(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(), k=4, staleness=2)
    for i, p in enumerate(model.parameters()):
        together = cl.allgather(p.detach().numpy().reshape(1, -1), name=f"start.{i}")
        assert np.all(together == together[0]), together
    loss_fn = torch.nn.MSELoss()
    first = None
    for step in range(200):
        idx = torch.randint(0, 512, (32,), generator=gen)
        opt.zero_grad()
        loss = loss_fn(model(features[idx]), targets[idx])
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    opt.close()
    final = loss_fn(model(features), targets).item()
    assert final < 1e-3 * first, (first, final)
    assert opt.rounds == 50, opt.rounds
    print(f"worker {rank}: loss {first:.3f} -> {final:.2e}", flush=True)


@spmd.case
def stopped():
    global victim
    import signal

    from commlib.server.client import ServerError

    def server_pids():
        """This job's servers on this host: our launcher's children running commlib.server."""
        pids = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if ppid == os.getppid() and b"commlib.server" in cmdline:
                pids.append(int(entry))
        return sorted(pids)

    x = np.zeros(20000, np.float32)  # partitions on every server
    geo = GeoSGD([x], k=1, staleness=None, overlap=False, name="stopped")
    x += 1
    geo.step()
    cl.barrier()
    victim = server_pids()[0]
    if rank == 0:
        os.kill(victim, signal.SIGSTOP)
    cl.barrier()
    start = time.monotonic()
    try:
        x += 1
        geo.step()
    except ServerError as exc:
        took = time.monotonic() - start
        assert "server" in str(exc) and "(rank " in str(exc) and "COMMLIB_SERVER_TIMEOUT" in str(exc), str(exc)
        print(f"worker {rank} failed after {took:.1f} s: {exc}", flush=True)
        assert took < FAILS_WITHIN_S, took
    else:
        raise AssertionError("a Geo-SGD exchange completed with a server stopped")


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    asked = sys.argv[1].split(",")
    spmd.main(["init", *(c for c in spmd.names() if c in asked)] + ([] if "stopped" in asked else ["shutdown"]))
    if "stopped" in asked:
        cl.barrier()
        if rank == 0:
            print("killing the stopped server", flush=True)
            os.kill(victim, __import__("signal").SIGKILL)
        time.sleep(30)  # the launcher ends the job
