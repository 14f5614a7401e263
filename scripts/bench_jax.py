"""commlib.jax against JAX's own multi-process collectives (jax.distributed + lax.psum over XLA's gloo CPU
collectives), on the same hosts, in the same job, interleaved.

    flock /tmp/commlib-timing.lock .venv/bin/python scripts/bench_jax.py            # 2 emulated hosts at 1 Gbit/s
    flock /tmp/commlib-timing.lock .venv/bin/python scripts/bench_jax.py --one-host # 2 ranks on this host

Modes, each a jitted SGD training step of a 25.2 M-parameter MLP (1024-4096-4096-1024, batch 32 per rank):

- ``local``: no communication (the compute floor);
- ``commlib``: ``cj.DistributedOptimizer(optax.sgd)``: inside the jitted step each gradient's allreduce
  starts as soon as XLA has computed it (overlapping the rest of the backward pass) and the step waits
  for all of them before the update;
- ``commlib-fp16``: the same with ``Compression.fp16``;
- ``commlib-grouped``: ``overlap=False``: the gradient pytree crosses as one grouped allreduce after the
  backward pass;
- ``numpy-allreduce``: not a step: the gradients' grouped allreduce alone through commlib's numpy API
  (what the crossing adds is ``commlib`` minus ``local`` minus this);
- ``gloo-psum``: the step under ``shard_map`` over every process's CPU device, gradients averaged with
  ``lax.pmean`` (XLA's CPU collectives, gloo), as a JAX user would without commlib.

Every mode first runs ``--warmup`` steps (auto's learning measures candidate algorithms on the first
calls of each size class; a long training run sees what follows). Rounds rotate which mode runs first; a step's time is the slowest rank's; the table gives medians. The
link bound of an allreduce of S bytes between 2 hosts is S (each host sends half in the reduce-scatter
and half in the allgather) at the link rate. Then the cost of crossing from jit into commlib: a 4 KiB
allreduce through the numpy API, a jitted call per allreduce, and 100 allreduces inside one jitted
``fori_loop``. Results go to docs/results/jax_<setting>.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODES = ("local", "commlib", "commlib-fp16", "commlib-grouped", "gloo-psum", "numpy-allreduce")
WIDTHS = (1024, 4096, 4096, 1024)


# ---- the job on every rank ------------------------------------------------------------------------------

def use_own_address_for_gloo(coordinator: str) -> None:
    """XLA's gloo binds to the address its host name resolves to, and an emulated host's name resolves to
    none; JAX offers no setting for it, so give gloo this host's address towards the coordinator."""
    import socket

    from jax._src.lib import _jax

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((coordinator, 9))
        address = s.getsockname()[0]
    make = _jax.make_gloo_tcp_collectives
    _jax.make_gloo_tcp_collectives = lambda **kwargs: make(hostname=address, **kwargs)


def worker(args) -> None:
    import numpy as np

    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import commlib.jax as cj
    cj.init()
    rank, size = cj.rank(), cj.size()
    use_own_address_for_gloo(args.coordinator)
    jax.distributed.initialize(coordinator_address=f"{args.coordinator}:{args.port}", num_processes=size,
                               process_id=rank)
    import jax.numpy as jnp
    import optax
    from jax import shard_map
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    rng = np.random.default_rng(0)
    params = {f"layer{i}": {"w": (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32),
                            "b": np.zeros(b, np.float32)}
              for i, (a, b) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:]))}
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    data = np.random.default_rng(1 + rank)
    x = data.standard_normal((args.batch, WIDTHS[0])).astype(np.float32)
    y = data.standard_normal((args.batch, WIDTHS[-1])).astype(np.float32)

    def loss(params, x, y):
        h = x
        for i in range(len(WIDTHS) - 1):
            h = h @ params[f"layer{i}"]["w"] + params[f"layer{i}"]["b"]
            h = jax.nn.relu(h) if i < len(WIDTHS) - 2 else h
        return jnp.mean((h - y) ** 2)

    def make_step(tx):
        @jax.jit
        def step(params, state, x, y):
            updates, state = tx.update(jax.grad(loss)(params, x, y), state, params)
            return optax.apply_updates(params, updates), state
        return step

    local_device = jax.local_devices()[0]
    on_local = lambda tree: jax.device_put(tree, local_device)  # noqa: E731
    runners = {}
    for mode, tx in (("local", optax.sgd(1e-3)), ("commlib", cj.DistributedOptimizer(optax.sgd(1e-3))),
                     ("commlib-fp16", cj.DistributedOptimizer(optax.sgd(1e-3), compression=cj.Compression.fp16,
                                                              name="fp16")),
                     ("commlib-grouped", cj.DistributedOptimizer(optax.sgd(1e-3), overlap=False, name="grouped"))):
        runners[mode] = [make_step(tx), on_local(params), tx.init(on_local(params)), on_local(x), on_local(y)]

    mesh = Mesh(np.array(jax.devices()), ("p",))
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("p"))
    tx = optax.sgd(1e-3)

    def gloo_step(params, x, y):
        grads = jax.lax.pmean(jax.grad(loss)(params, x, y), "p")
        return optax.apply_updates(params, tx.update(grads, tx.init(params))[0])

    gloo = jax.jit(shard_map(gloo_step, mesh=mesh, in_specs=(P(), P("p"), P("p")), out_specs=P()))
    global_params = jax.tree_util.tree_map(lambda a: jax.make_array_from_process_local_data(replicated, a), params)
    gx = jax.make_array_from_process_local_data(split, x)
    gy = jax.make_array_from_process_local_data(split, y)
    runners["gloo-psum"] = [gloo, global_params, None, gx, gy]

    import commlib as cl
    host_grads = [np.ones_like(a) for a in jax.tree_util.tree_leaves(params)]

    # Where a commlib step's time goes: the crossings' calls into commlib's API are timed (this wraps the
    # functions commlib.jax calls; the wrappers cost a few microseconds per call).
    from commlib.jax import collectives as jcol
    events = []

    def timed(f):
        def call(*a, **k):
            begin = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                events.append((begin, time.perf_counter()))
        return call
    for fn in ("allreduce", "grouped_allreduce", "allreduce_async_", "synchronize"):
        setattr(jcol._cl, fn, timed(getattr(jcol._cl, fn)))
    profile = {mode: [] for mode in MODES if mode.startswith("commlib")}

    def run_steps(mode, steps):
        if mode == "numpy-allreduce":  # the gradients' grouped allreduce alone, through the numpy API
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                cl.grouped_allreduce(host_grads, name="numpy.grads")
                times.append(time.perf_counter() - start)
            return times
        state = runners[mode]
        step, p, s, xx, yy = state
        times = []
        for _ in range(steps):
            events.clear()
            start = time.perf_counter()
            if mode == "gloo-psum":
                p = step(p, xx, yy)
            else:
                p, s = step(p, s, xx, yy)
            jax.block_until_ready(p)
            end = time.perf_counter()
            times.append(end - start)
            if mode in profile and events:  # before the first crossing, from it to the last one's end, after
                first, last = min(e[0] for e in events), max(e[1] for e in events)
                profile[mode].append((first - start, last - first, end - last))
        state[1], state[2] = p, s
        return times

    load_start = os.getloadavg()[0]
    for mode in MODES:  # compile and warm up (past auto's learning calls)
        run_steps(mode, 1 if mode in ("local", "gloo-psum") else args.warmup)
    for mode in profile:
        profile[mode].clear()
    cj.barrier()
    times = {mode: [] for mode in MODES}
    for r in range(args.rounds):
        order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
        for mode in order:
            cj.barrier()
            mine = run_steps(mode, args.steps)
            times[mode] += [max(ts) for ts in zip(*cj.allgather_object(mine))]

    # the overlapped and the grouped step give the same parameters from the same start
    p0 = on_local(params)
    check = {}
    for mode in ("commlib", "commlib-grouped"):
        step, _, _, xx, yy = runners[mode]
        tx_state = runners[mode][2]
        check[mode] = jax.tree_util.tree_leaves(step(p0, tx_state, xx, yy)[0])
    same = all(np.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(check["commlib"], check["commlib-grouped"]))
    if not all(cj.allgather_object(same)):
        raise SystemExit("the overlapped step's parameters differ from the grouped step's")

    # crossing into commlib for a 4 KiB allreduce
    small = np.ones(1024, np.float32)
    per_call = jax.jit(lambda v: cj.allreduce(v, op=cj.Sum, name="small.jit"))
    in_loop = jax.jit(lambda v: jax.lax.fori_loop(0, 100, lambda i, a: cj.allreduce(a, op=cj.Sum) * 0.5, v))
    jsmall = jnp.asarray(small)
    per_call(jsmall).block_until_ready()
    in_loop(jsmall).block_until_ready()
    crossing = {"numpy": [], "jit-call": [], "jit-loop": []}
    for _ in range(args.small_rounds):
        cj.barrier()
        start = time.perf_counter()
        for _ in range(100):
            cl.allreduce(small, op=cl.Sum, name="small.numpy")
        crossing["numpy"].append((time.perf_counter() - start) / 100)
        cj.barrier()
        start = time.perf_counter()
        for _ in range(100):
            per_call(jsmall).block_until_ready()
        crossing["jit-call"].append((time.perf_counter() - start) / 100)
        cj.barrier()
        start = time.perf_counter()
        in_loop(jsmall).block_until_ready()
        crossing["jit-loop"].append((time.perf_counter() - start) / 100)
    crossing = {k: max(statistics.median(v) for v in zip(*cj.allgather_object([statistics.median(v)])))
                for k, v in crossing.items()}

    if rank == 0:
        result = {"ranks": size, "params": int(n_params), "gradient_bytes": int(n_params) * 4,
                  "batch_per_rank": args.batch, "rounds": args.rounds, "steps": args.steps,
                  "median_s": {m: statistics.median(t) for m, t in times.items()},
                  "min_s": {m: min(t) for m, t in times.items()},
                  "small_allreduce_4KiB_s": crossing,
                  "profile_rank0_s": {m: [statistics.median(x) for x in zip(*v)] for m, v in profile.items() if v},
                  "jax": jax.__version__, "warmup": args.warmup, "load_average_start": load_start,
                  "load_average_end": os.getloadavg()[0]}
        print("RESULT " + json.dumps(result), flush=True)
    jax.distributed.shutdown()
    cj.shutdown()


# ---- the driver ---------------------------------------------------------------------------------------

def rate_bits(rate: str) -> float:
    from commlib.testing.cluster import parse_rate
    return parse_rate(rate)


def table(result: dict, args, command: str) -> str:
    med = result["median_s"]
    lines = [f"# commlib.jax vs jax.distributed + lax.pmean (gloo): {args.label}", "",
             f"Command: `{command}`  ", f"Commit: {args.commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"jax {result['jax']}; {result['ranks']} ranks; MLP {result['params']:,} parameters "
             f"({result['gradient_bytes'] / 1e6:.1f} MB of float32 gradients), batch {result['batch_per_rank']} per "
             f"rank; {result['rounds']} rotated rounds x {result['steps']} steps per mode; the slowest rank's "
             f"step, median, after {result.get('warmup', 1)} warm-up steps per mode. Load average "
             f"{result.get('load_average_start', float('nan')):.1f} at the start, {result['load_average_end']:.1f} at the "
             f"end ({'the 2 cores are shared by both ranks' if not args.rate else 'both emulated hosts share the 2 cores'}).", "",
             "| mode | median step (s) | min (s) | vs gloo-psum | vs local |", "|---|---|---|---|---|"]
    for mode in MODES:
        lines.append(f"| {mode} | {med[mode]:.3f} | {result['min_s'][mode]:.3f} | "
                     f"{med[mode] / med['gloo-psum']:.2f}x | {med[mode] / med['local']:.2f}x |")
    if args.rate:
        bound = result["gradient_bytes"] * 8 / rate_bits(args.rate)
        lines += ["", f"Link bound at {args.rate} (the gradient's bytes once over the link): {bound:.3f} s; "
                  f"plus the local step: {bound + med['local']:.3f} s. commlib: "
                  f"{med['commlib'] / (bound + med['local']):.2f}x of that; gloo-psum: "
                  f"{med['gloo-psum'] / (bound + med['local']):.2f}x; commlib-fp16 against half the bytes: "
                  f"{med['commlib-fp16'] / (bound / 2 + med['local']):.2f}x."]
    if result.get("profile_rank0_s"):
        lines += ["", "Where a commlib step's time goes (rank 0, medians): from the step's start to the first "
                  "crossing into commlib (the forward and backward pass up to the first gradient handed over), "
                  "from there to the end of the last crossing (communication, overlapping the rest of the "
                  "backward pass when the optimizer overlaps), and after it (XLA copies the results into its "
                  "buffers and applies the update):", "",
                  "| mode | before (s) | crossings (s) | after (s) |", "|---|---|---|---|"]
        for mode, (before, span, after) in result["profile_rank0_s"].items():
            lines.append(f"| {mode} | {before:.3f} | {span:.3f} | {after:.3f} |")
    small = result["small_allreduce_4KiB_s"]
    lines += ["", "4 KiB allreduce (Sum), per call, median of rounds of 100, slowest rank:", "",
              "| how | us per allreduce | vs numpy |", "|---|---|---|"]
    for how, label in (("numpy", "commlib numpy API"), ("jit-call", "one jitted call per allreduce"),
                       ("jit-loop", "100 allreduces in one jitted fori_loop")):
        lines.append(f"| {label} | {small[how] * 1e6:.0f} | {small[how] / small['numpy']:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one-host", action="store_true", help="2 ranks on this host instead of 2 emulated hosts")
    parser.add_argument("--rate", default="1gbit", help="emulated link rate")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--small-rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=12, help="steps per commlib mode before timing")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    import socket
    command = "python scripts/bench_jax.py " + " ".join(sys.argv[1:])
    args.commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                 text=True).stdout.strip()
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    job = [sys.executable, str(Path(__file__).resolve()), "--worker", "--rounds", str(args.rounds), "--steps",
           str(args.steps), "--small-rounds", str(args.small_rounds), "--batch", str(args.batch),
           "--warmup", str(args.warmup)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if args.one_host:
        args.rate, args.label = None, "2 ranks on one host"
        from commlib.testing.cluster import find_mpiexec
        done = subprocess.run([find_mpiexec(), "-n", "2"] + job + ["--port", str(port)], env=env,
                              capture_output=True, text=True, timeout=args.timeout)
        out, name = done.stdout + done.stderr, "jax_1host_2ranks"
    else:
        from commlib.testing.cluster import Cluster
        args.label = f"2 emulated hosts x 1 rank at {args.rate}"
        with Cluster(hosts=[1, 1], rate=args.rate) as cluster:
            done = cluster.mpiexec(job + ["--coordinator", cluster.host_address(0), "--port", str(port)],
                                   timeout=args.timeout, env=env, check=False)
        out, name = done.stdout, f"jax_2hosts_{args.rate}"
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if not lines:
        print(out[-6000:], file=sys.stderr)
        return 1
    result = json.loads(lines[-1][len("RESULT "):])
    result["command"] = command
    text = table(result, args, command)
    print(text)
    (REPO / "docs" / "results" / f"{name}.md").write_text(text)
    (REPO / "docs" / "results" / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
