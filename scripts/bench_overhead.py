"""commlib's own cost per call and per tensor, against MPI's own calls, interleaved in one job (run under
mpiexec, or on emulated hosts: ``python -m commlib.testing.cluster run --hosts 1,1 --rate 1gbit --
python scripts/bench_overhead.py``).

    flock -x /tmp/commlib-cpu.lock mpiexec -n 2 python scripts/bench_overhead.py [--sizes 4,64,1K,4K,16K,64K]
        [--rounds 7] [--calls 1000] [--stages] [--sets] [--json FILE]

Three parts:

- **sweep**: a named in-place allreduce (``commlib.allreduce_(buf, op=Sum, name=...)``, negotiation
  included) against MPI's ``Allreduce`` called directly, float32, at each size; each round times
  ``--calls`` consecutive calls of each after a barrier, the order rotating round by round; the figure is
  the median over rounds of the slowest rank's time per call, and commlib's overhead is the difference.
- **stages** (``--stages``): where a lone 4 KiB call's time goes on each rank, from stamps taken at the
  public steps of the call (the request made; this rank's round message posted; the round decided; the
  response handed to the lane; MPI's allreduce entered and left; the result set; the call returned),
  medians over ``--calls`` calls. Each stamp wraps a function and costs ~0.1-0.3 us itself: read the
  stages relative to each other, the sweep for the call's real time.
- **sets** (``--sets``): the 160 gradients of ``scripts/horovod_train.py``'s small-160 model (80 x
  (64 KiB + 512 B)) and the ResNet-50 gradient set (``scripts/resnet50_shapes.py``, 161 tensors, 102 MB),
  each submitted with ``allreduce_async_`` (Average) in backward order, then synchronized; against one MPI
  ``Allreduce`` per tensor and against the algorithm alone: the same buffers reduced in place by one
  ``Engine.allreduce_many_`` call (auto's choice for their total; no negotiation, no fusion, no handles).
  commlib's cost per tensor is (coordinator - algorithm alone) / tensors.

Rank 0 prints the tables; ``--json`` writes every sample.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
import commlib as cl  # noqa: E402
from commlib.bench.core import turn_order  # noqa: E402
from commlib.config import Config, parse_size  # noqa: E402
from commlib.engine import Engine  # noqa: E402
from commlib.topology import Topology  # noqa: E402
from commlib.transport.mpi import MPITransport  # noqa: E402
from resnet50_shapes import resnet50_shapes  # noqa: E402

SMALL_160 = [(128, 128), (128,)] * 80


def per_call(comm, fn, calls: int) -> float:
    """The slowest rank's time per call of ``calls`` consecutive calls, from a barrier."""
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return comm.allreduce((time.perf_counter() - start) / calls, op=MPI.MAX)


def interleaved(comm, peers: dict, rounds: int, calls: int) -> dict[str, list[float]]:
    names = list(peers)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for i in turn_order(len(names), r):
            times[names[i]].append(per_call(comm, peers[names[i]], calls))
    return times


def sweep(comm, sizes: list[int], rounds: int, calls: int) -> list[dict]:
    rows = []
    for nbytes in sizes:
        buf = np.ones(max(1, nbytes // 4), np.float32)
        name = f"sweep.{nbytes}"

        def mpi():
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

        def commlib():
            cl.allreduce_(buf, op=cl.Sum, name=name)

        for _ in range(200):  # auto settles the size class; connections and caches warm up
            commlib()
            mpi()
        times = interleaved(comm, {"mpi": mpi, "commlib": commlib}, rounds, calls)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"bytes": buf.nbytes, "mpi_s": med["mpi"], "commlib_s": med["commlib"], "samples_s": times})
    return rows


STAGES = ("request made", "round posted", "round decided", "handed to lane", "MPI entered", "MPI left",
          "result set", "returned")


def stages(comm, calls: int) -> dict:
    """Median time from the call's start to each stage on this rank (us), stamping public steps."""
    from commlib.coordinator import execution, negotiation, requests
    from commlib.transport import control, mpi as mpi_transport

    stamps: dict[str, int] = {}
    clock = time.perf_counter_ns

    def wrap(owner, attribute, stage, after=False):
        original = getattr(owner, attribute)

        def stamped(*args, **kwargs):
            if not after:
                stamps.setdefault(stage, clock())
            result = original(*args, **kwargs)
            if after:
                stamps.setdefault(stage, clock())
            return result
        setattr(owner, attribute, stamped)
        return owner, attribute, original

    def native_stamped(self, dtype, op):
        run = native(self, dtype, op)

        def stamped(buf):
            stamps.setdefault("MPI entered", clock())
            run(buf)
            stamps.setdefault("MPI left", clock())
        return stamped

    native = mpi_transport.MPITransport.native_allreducer
    undo = [wrap(requests.Entry, "__init__", "request made", after=True),
            wrap(control.ControlChannel, "post_all", "round posted", after=True),
            wrap(negotiation.ReadyTable, "decide_alone", "round decided", after=True),
            wrap(execution.LaneSet, "run", "handed to lane"),
            wrap(execution.LaneSet, "run_one", "handed to lane"),  # the lone path's
            wrap(requests.Handle, "set_result", "result set")]
    mpi_transport.MPITransport.native_allreducer = native_stamped
    buf = np.ones(1024, np.float32)
    try:
        for _ in range(300):
            cl.allreduce_(buf, op=cl.Sum, name="stages")
        comm.Barrier()
        rows = []
        for _ in range(calls):
            stamps.clear()
            start = clock()
            cl.allreduce_(buf, op=cl.Sum, name="stages")
            stamps["returned"] = clock()
            rows.append([stamps[s] - start if s in stamps else np.nan for s in STAGES])
    finally:
        for owner, attribute, original in undo:
            setattr(owner, attribute, original)
        mpi_transport.MPITransport.native_allreducer = native
    medians = np.nanmedian(np.array(rows, np.float64), axis=0) / 1e3
    return {stage: float(us) for stage, us in zip(STAGES, medians)}


def sets(comm, rounds: int) -> list[dict]:
    config = Config.load()
    engine = Engine(MPITransport(comm.Dup()), Topology.detect(comm, config.local_size), config)
    rows = []
    for label, shapes in (("small-160", SMALL_160), ("resnet-50", resnet50_shapes())):
        def fresh():
            return [np.random.default_rng(i).standard_normal(int(np.prod(s))).astype(np.float32).reshape(s)
                    for i, s in enumerate(shapes)]

        grads, mpi_grads, alone_grads = fresh(), fresh(), fresh()
        backward = list(reversed(range(len(grads))))
        alone_flats = [alone_grads[i].reshape(-1) for i in backward]

        def coordinator():
            handles = [cl.allreduce_async_(grads[i], op=cl.Average, name=f"{label}.{i}") for i in backward]
            for handle in handles:
                cl.synchronize(handle)

        def mpi_per_tensor():
            for i in backward:
                comm.Allreduce(MPI.IN_PLACE, mpi_grads[i], op=MPI.SUM)

        def algorithm_alone():
            engine.allreduce_many_(alone_flats, cl.Average, name=label)

        peers = {"mpi_per_tensor": mpi_per_tensor, "algorithm_alone": algorithm_alone, "coordinator": coordinator}
        for _ in range(40):  # auto settles (each peer has its own classes); fusion buffers are made
            for fn in peers.values():
                fn()
        times = interleaved(comm, peers, rounds, 1)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"set": label, "tensors": len(shapes), "bytes": 4 * sum(int(np.prod(s)) for s in shapes),
                     "median_s": med, "samples_s": times})
    engine.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4,64,1K,4K,16K,64K", help="sweep sizes in bytes (K/M suffix)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--calls", type=int, default=1000, help="calls per round and peer in the sweep")
    parser.add_argument("--set-rounds", type=int, default=20, help="interleaved rounds of the sets")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--stages", action="store_true", help="also: where a lone 4 KiB call's time goes")
    parser.add_argument("--sets", action="store_true", help="also: the 160-tensor and ResNet-50 sets")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    cl.init()
    result: dict = {"ranks": comm.Get_size(), "nodes": cl.cross_size(),
                    "mpi": MPI.Get_library_version().splitlines()[0].strip()}
    if not args.no_sweep:
        result["sweep"] = sweep(comm, [parse_size(s) for s in args.sizes.split(",")], args.rounds, args.calls)
    if args.stages:
        result["stages_us"] = comm.gather(stages(comm, max(args.calls, 2000)))
    if args.sets:
        result["sets"] = sets(comm, args.set_rounds)
    cl.shutdown()
    if comm.Get_rank() != 0:
        return
    print(f"# {result['ranks']} ranks on {result['nodes']} node(s), {result['mpi']}")
    if "sweep" in result:
        print(f"# sweep: float32 Sum in place, {args.rounds} interleaved rounds x {args.calls} calls, median of "
              "the slowest rank's time per call")
        print(f"{'bytes':>8} {'MPI us':>9} {'commlib us':>11} {'ratio':>7} {'overhead us':>12}")
        for row in result["sweep"]:
            mpi_us, ours_us = row["mpi_s"] * 1e6, row["commlib_s"] * 1e6
            print(f"{row['bytes']:>8} {mpi_us:>9.2f} {ours_us:>11.2f} {ours_us / mpi_us:>6.2f}x "
                  f"{ours_us - mpi_us:>12.2f}")
    if "stages_us" in result:
        print("# stages of a lone 4 KiB call: median us from the call's start, per rank (stamps included)")
        print(f"{'stage':>16} " + " ".join(f"{'rank ' + str(r):>9}" for r in range(len(result['stages_us']))))
        for stage in STAGES:
            print(f"{stage:>16} " + " ".join(f"{s[stage]:>9.2f}" for s in result["stages_us"]))
    if "sets" in result:
        print(f"# sets: allreduce_async_ of every tensor in backward order, then synchronize; "
              f"{args.set_rounds} interleaved rounds, median of the slowest rank's time")
        print(f"{'set':>10} {'tensors':>7} {'MB':>6} {'MPI per tensor ms':>18} {'algorithm alone ms':>19} "
              f"{'coordinator ms':>15} {'vs MPI':>7} {'us per tensor':>14}")
        for row in result["sets"]:
            med = row["median_s"]
            per_tensor = (med["coordinator"] - med["algorithm_alone"]) / row["tensors"] * 1e6
            print(f"{row['set']:>10} {row['tensors']:>7} {row['bytes'] / 1e6:>6.1f} "
                  f"{med['mpi_per_tensor'] * 1e3:>18.2f} {med['algorithm_alone'] * 1e3:>19.2f} "
                  f"{med['coordinator'] * 1e3:>15.2f} {med['coordinator'] / med['mpi_per_tensor']:>6.2f}x "
                  f"{per_tensor:>14.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
