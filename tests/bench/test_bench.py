"""commlib-bench: the real tool under mpiexec on 1-4 ranks (JSON parsed, #wrong must be 0), its command
line errors, its plot, its non-zero exit on wrong results; and, in process, its option checks and check
data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mpirun import cross_memory_attach_permitted, run_mpi

from commlib.bench.collective import exact_limit, reduction_input, reduction_result
from commlib.bench.collectives import COLLECTIVES
from commlib.bench.core import MAX_ROUNDS, count_wrong, layouts, timed_blocks, tolerance
from commlib.bench.options import DTYPES, OPS, parse_options
from commlib.algorithms.spec import names
from commlib.compression import Compression
from commlib.ops import ReduceOp

# ps needs summation servers, which these jobs do not have: commlib-bench skips it under --algo all
# (nccl reduces device tensors only: --device cuda measures it)
ALL = [a for a in names(with_auto=False) if a not in ("ps", "nccl")] + ["auto"]
ALL_MULTINODE = [a for a in ALL if a != "cma"]  # cma needs every rank on one node


def bench(nprocs, tmp_path, *flags, name="out.json", timeout=150, **kwargs):
    """Run commlib-bench on ``nprocs`` ranks with --json; return (parsed JSON, output)."""
    path = tmp_path / name
    out = run_mpi(nprocs, "bench_cli.py", *flags, "--json", str(path), timeout=timeout, **kwargs)
    return json.loads(path.read_text()), out


def assert_all_right(data, algorithms, nprocs):
    assert data["metadata"]["ranks"] == nprocs
    assert data["results"], "no sizes were measured"
    sizes = [r["nbytes"] for r in data["results"]]
    assert sizes == sorted(set(sizes)), f"sizes repeated or out of order: {sizes}"
    for r in data["results"]:
        assert list(r["algorithms"]) == list(algorithms)
        for algorithm, m in r["algorithms"].items():
            assert m["wrong"] == 0, f"{algorithm} at {r['nbytes']} B: {m['wrong']} wrong values"
            assert m["time_us"] > 0 and m["algbw_gbs"] > 0
            factor = 2 * (nprocs - 1) / nprocs if data["metadata"]["collective"] == "allreduce" else None
            if factor is not None:
                assert m["busbw_gbs"] == pytest.approx(m["algbw_gbs"] * factor)
    assert data["wrong_total"] == 0


# -- the real tool on real ranks ------------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("nprocs, flags", [
    (1, ["-d", "half", "-o", "max"]),
    (2, ["-d", "float", "-o", "sum"]),
    (2, ["-d", "half", "-o", "avg"]),
    (2, ["-d", "uint8", "-o", "max"]),
    (3, ["-d", "int64", "-o", "prod"]),
    (3, ["-d", "bfloat16", "-o", "prod"]),
    (3, ["-d", "double", "-o", "avg"]),
    (4, ["-d", "int8", "-o", "sum"]),
    (4, ["--local-size", "2", "-d", "float", "-o", "avg"]),
    (4, ["--local-size", "2", "-d", "int32", "-o", "min"]),
])
def test_allreduce_every_algorithm_is_right(tmp_path, nprocs, flags):
    # -b 1: the first sizes hold fewer elements than there are ranks.
    data, out = bench(nprocs, tmp_path, "-b", "1", "-e", "64K", "-f", "8", "-n", "3", "-w", "1",
                      "--algo", "all", *flags)
    one_node_cma = nprocs == 1 or cross_memory_attach_permitted()  # one rank: cma trivially available
    expected = ALL_MULTINODE if "--local-size" in flags or not one_node_cma else ALL
    assert_all_right(data, expected, nprocs)
    assert data["results"][0]["count"] == 1
    assert "# Wrong values: 0 OK" in out
    assert "Average bus bandwidth" in out
    assert "commlib-bench allreduce [" not in out, "no progress bar when stderr is not a terminal"
    meta = data["metadata"]
    assert meta["mpi_version"] and meta["commlib_version"] and meta["algorithms"] == expected
    assert meta["nodes"] == (2 if "--local-size" in flags else 1)


@pytest.mark.mpi
@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_compressed_allreduce_is_right(tmp_path, compression):
    algorithms = [a for a in ALL if a not in ("native", "cma")]
    data, _ = bench(4, tmp_path, "-b", "4", "-e", "256K", "-f", "16", "-n", "2", "-w", "1", "--local-size", "2",
                    "--compression", compression, "--algo", ",".join(algorithms))
    assert_all_right(data, algorithms, 4)
    assert data["metadata"]["compression"] == compression


@pytest.mark.mpi
@pytest.mark.parametrize("collective", ["allgather", "broadcast", "reducescatter", "alltoall"])
def test_other_collectives_are_right(tmp_path, collective):
    flags = ["-r", "2"] if collective == "broadcast" else []
    data, _ = bench(3, tmp_path, "-C", collective, "-b", "1", "-e", "64K", "-f", "16", "-n", "2", "-w", "1",
                    "-d", "half", *flags)
    assert_all_right(data, ["engine"], 3)
    assert data["metadata"]["op"] == ("sum" if collective == "reducescatter" else "none")
    assert data["results"][0]["count"] == (3 if collective != "broadcast" else 1)


@pytest.mark.mpi
def test_algo_all_leaves_out_what_the_shape_refuses_with_a_note(tmp_path):
    # Nodes of 2 and 1 ranks: torus2d (no --torus) refuses; with compression native refuses too.
    data, out = bench(3, tmp_path, "-b", "4", "-e", "16K", "-f", "64", "-n", "2", "-w", "1", "--local-size", "2",
                      "--algo", "all", "--compression", "fp16")
    expected = [a for a in ALL if a not in ("native", "torus2d", "cma")]
    assert_all_right(data, expected, 3)
    assert set(data["metadata"]["skipped"]) == {"native", "torus2d", "cma", "ps"}  # ps: this job has no servers
    assert "# skipped torus2d: torus2d needs nodes of equal size" in out


@pytest.mark.mpi
def test_bad_flags_are_clear_errors(tmp_path):
    out = run_mpi(2, "bench_cli.py", "--algo", "ring,bogus", expect_fail=True, timeout=60)
    assert "unknown algorithm(s) bogus" in out
    assert out.count("unknown algorithm(s) bogus") == 1, "only rank 0 should print the error"
    out = run_mpi(1, "bench_cli.py", "--compression", "fp16", "--algo", "native,ring", expect_fail=True,
                  timeout=60)
    assert "cannot apply to native" in out
    out = run_mpi(2, "bench_cli.py", "-C", "broadcast", "-r", "5", expect_fail=True, timeout=60)
    assert "-r/--root 5 is not a rank of this 2-rank job" in out
    out = run_mpi(4, "bench_cli.py", "--algo", "ring,torus2d", "--torus", "3x2", expect_fail=True, timeout=60)
    assert "torus2d cannot run here" in out and "X*Y = 4" in out


@pytest.mark.mpi
def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib: pip install -e '.[bench]'")
    png = tmp_path / "busbw.png"
    data, out = bench(2, tmp_path, "-b", "1K", "-e", "16K", "-f", "4", "-n", "2", "-w", "0", "-c", "0",
                      "--algo", "native,ring,auto", "--plot", str(png), "--progress")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 5000
    assert f"plot written to {png}" in out
    assert "commlib-bench allreduce [" in out and "3/3" in out, "--progress draws the bar on stderr"
    assert data["wrong_total"] is None and "# Wrong values: not checked (-c 0)" in out
    assert all(m["wrong"] is None for r in data["results"] for m in r["algorithms"].values())


@pytest.mark.mpi
def test_wrong_results_make_the_exit_code_non_zero():
    # A collective whose run step reduces with Max while the check expects Sum: real wrong values.
    out = run_mpi(2, "bench_wrong_results.py", "-b", "64", "-e", "4K", "-f", "8", "-n", "1", "-w", "0",
                  "--algo", "native,ring", expect_fail=True, timeout=60)
    assert "FAILED" in out
    rows = [line.split() for line in out.splitlines() if line.strip() and not line.startswith("#")
            and line.split()[0].isdigit()]
    assert len(rows) == 6, out  # one row per size and algorithm
    assert [row[2] for row in rows] == ["native", "ring"] * 3, out
    for row in rows:
        count, wrong = int(row[1]), int(row[6])
        assert 0 < wrong <= 2 * count, row


# -- in process: options and check data ------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["-d", "half", "--compression", "fp16", "--algo", "ring"], "compresses float32"),
    (["--compression", "bf16"], "cannot apply to native"),
    (["-d", "int32", "-o", "avg"], "needs a floating type"),
    (["-C", "allgather", "--algo", "ring"], "has one implementation"),
    (["-C", "allgather", "-o", "max"], "does not reduce"),
    (["-b", "64K", "-e", "4K"], "smaller than"),
    (["-b", "12Q"], "is not a byte count"),
    (["-d", "complex64"], "is not one of"),
    (["--torus", "3by2"], "not a grid shape"),
    (["-n", "0"], "not a positive integer"),
])
def test_incompatible_or_bad_options_exit_2_with_a_message(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        parse_options(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.mpi
def test_table_width_does_not_grow_with_the_algorithms(tmp_path):
    # --algo all, the link-bound column and the model's prediction: still one narrow row per algorithm
    data, out = bench(2, tmp_path, "-b", "4K", "-e", "64K", "-f", "16", "-n", "2", "-w", "1", "--rounds", "1",
                      "--algo", "all", "--explain", "--link-rate", "1gbit")
    widest = max(len(line) for line in out.splitlines() if line and line[0] in " 0123456789")
    assert widest <= 125, out
    auto = data["results"][0]["algorithms"]["auto"]
    assert auto["chosen"] in ALL and auto["predicted_us"] > 0, auto
    assert all(m["x_bound"] is None for r in data["results"] for m in r["algorithms"].values()), \
        "one node has no link bound"
    # what auto learned: one line per size class it measured
    assert "# What auto learned" in out and "4K-8K" in out.split("# What auto learned")[1], out


@pytest.mark.mpi
def test_calibrate_writes_a_profile_that_auto_reads(tmp_path):
    profile = tmp_path / "tuning.json"
    data, out = bench(2, tmp_path, "-b", "4K", "-n", "2", "-w", "1", "--rounds", "1", "--algo", "auto,native",
                      "--calibrate", str(profile), timeout=200)
    doc = json.loads(profile.read_text())
    assert doc["version"] == 1 and doc["shape"]["ranks"] == 2 and "commlib-bench" in doc["command"]
    assert doc["model"]["intra"]["alpha_s"] > 0 and doc["model"]["reduce_s_per_byte"] > 0, doc
    # a second job loads it (rank 0 reads, every rank gets it) and prints it with --explain
    _, out = bench(2, tmp_path, "-b", "4K", "-n", "2", "-w", "1", "--rounds", "1", "--algo", "auto",
                   "--explain", name="second.json", env={"COMMLIB_TUNING_FILE": str(profile)})
    assert f"cost model ({profile})" in out, out


@pytest.mark.mpi
def test_a_bad_profile_is_an_error_on_every_rank(tmp_path):
    profile = tmp_path / "tuning.json"
    profile.write_text('{"version": 1, "model": {"intra": {"alpha_s": -1, "beta_s_per_byte": 0}}}')
    out = run_mpi(2, "bench_cli.py", "-b", "4K", "-n", "1", "-w", "0", expect_fail=True, timeout=60,
                  env={"COMMLIB_TUNING_FILE": str(profile)})
    assert "must be a finite number >= 0" in out and str(profile) in out, out


def test_options_parse_like_nccl_tests():
    opts = parse_options(["-b", "4K", "-e", "64M", "-f", "4", "-n", "7", "-w", "2", "-c", "0", "-o", "prod",
                          "-d", "bfloat16", "--algo", "all", "--local-size", "2", "--torus", "2x2"])
    assert (opts.minbytes, opts.maxbytes, opts.stepfactor) == (4096, 64 << 20, 4)
    assert (opts.iters, opts.warmup_iters, opts.check, opts.op) == (7, 2, False, ReduceOp.PRODUCT)
    assert opts.dtype_name == "bfloat16" and opts.algorithms == tuple(a for a in names(with_auto=False) if a != "nccl") + ("auto",)
    assert opts.sizes() == [4096 * 4 ** i for i in range(8)]
    assert opts.config().local_size == 2 and opts.config().torus_shape == (2, 2)
    assert opts.rounds == 5
    assert parse_options(["-n", "3"]).rounds == 3, "rounds never exceed iterations"


def test_min_time_adds_rounds_of_the_same_length_where_calls_are_short():
    """--min-time: short calls get more interleaved rounds (blocks of -n/--rounds calls), up to MAX_ROUNDS;
    long calls keep -n in --rounds."""
    assert timed_blocks(8, 4, 0.0, 1e-4) == [2, 2, 2, 2]
    assert timed_blocks(8, 4, 0.5, 1.0) == [2, 2, 2, 2]  # 1 s calls: already over 0.5 s
    assert timed_blocks(8, 4, 0.02, 1e-3) == [2] * 10  # 2 ms per round: 10 rounds make 20 ms
    assert timed_blocks(5, 2, 1.0, 1e-6) == [3, 2] * (MAX_ROUNDS // 2)
    opts = parse_options(["--auto-warmup", "19", "--min-time", "0.5", "-w", "2"])
    assert (opts.auto_warmup, opts.min_time, opts.warmup_iters) == (19, 0.5, 2)
    assert parse_options([]).auto_warmup is None and parse_options([]).min_time == 0.0


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_min_time_must_be_finite_and_not_negative(value, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_options(["--min-time", value])
    assert exc.value.code == 2 and "--min-time must be a finite number" in capsys.readouterr().err


@pytest.mark.mpi
def test_auto_warmup_and_min_time_on_a_job(tmp_path):
    """auto gets its own untimed calls per size; 4 KiB calls get many more rounds than -n/--rounds (the
    same on every rank: the sweep would hang otherwise), 1 round each of 1 call."""
    data, out = bench(2, tmp_path, "-b", "4K", "-e", "16K", "-f", "4", "-n", "2", "-w", "1", "--rounds", "2",
                      "--auto-warmup", "19", "--min-time", "0.01", "--algo", "native,auto")
    assert_all_right(data, ["native", "auto"], 2)
    assert all(r["rounds"] > 2 and r["iters"] == r["rounds"] for r in data["results"]), data["results"]
    assert "warmup 1 (auto 19)" in out and "under 0.01 s" in out, out


def test_layouts_round_sizes_to_whole_elements_per_rank():
    opts = parse_options(["-b", "1", "-e", "64", "-f", "2"])
    for name, cls in COLLECTIVES.items():
        steps = layouts(opts, cls(), 3)
        assert [s.nbytes for s in steps] == sorted({s.nbytes for s in steps})
        for s in steps:
            assert s.send_count >= 1 and s.recv_count >= 1 and s.nbytes == s.count * 4
            if name != "allreduce" and name != "broadcast":
                assert s.count % 3 == 0


@pytest.mark.parametrize("dtype_name", ["float", "half", "bfloat16", "double", "int8", "uint8", "int32", "int64"])
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("nranks", [1, 2, 3, 5, 8])
def test_check_values_reduce_exactly_in_the_dtype(dtype_name, op_name, nranks):
    """Reducing the check inputs in the dtype itself, in two different orders, gives the expected result
    exactly: a correct algorithm can never be reported wrong, whatever its order."""
    dtype, op = DTYPES[dtype_name], OPS[op_name]
    if op is ReduceOp.AVERAGE and dtype.kind in "iu":
        return
    limit = exact_limit(dtype)
    count = 1000
    inputs = [reduction_input(0, count, r, nranks, op, limit).astype(dtype) for r in range(nranks)]
    expected = reduction_result(0, count, nranks, op, limit)
    ufunc = {ReduceOp.SUM: np.add, ReduceOp.AVERAGE: np.add, ReduceOp.PRODUCT: np.multiply,
             ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}[op]
    for order in (inputs, inputs[::-1]):
        acc = order[0].copy()
        for x in order[1:]:
            acc = ufunc(acc, x).astype(dtype)
        if op is ReduceOp.AVERAGE:
            acc = (acc.astype(np.float64) / nranks).astype(dtype)
        assert count_wrong(acc, expected, tolerance(expected, dtype, op, nranks, None)) == 0
        if nranks > 1 and op is not ReduceOp.PRODUCT:
            assert len({tuple(x.tolist()) for x in inputs}) > 1, "ranks must contribute different values"
    off = acc.copy()
    off[::7] = (off[::7].astype(np.float64) + 1).astype(dtype)
    assert count_wrong(off, expected, tolerance(expected, dtype, op, nranks, None)) == len(off[::7])


def test_compression_tolerance_is_tight():
    expected = np.array([0.0, 100.0, 1000.0])
    tol = tolerance(expected, np.dtype(np.float32), ReduceOp.SUM, 3, Compression.fp16)
    assert np.all(tol < 3.0)
    assert count_wrong(np.array([0.0, 101.0, 1000.5], dtype=np.float32), expected, tol) == 1


def test_each_round_starts_with_the_next_algorithm_and_predecessors_vary():
    """Interleaved timing rotates the order, so a slow first block in a round lands on every algorithm,
    and changes its stride every ``count`` rounds, so no algorithm always follows the same one."""
    from commlib.bench.core import turn_order

    assert turn_order(3, 0) == [0, 1, 2]
    assert turn_order(3, 1) == [1, 2, 0]
    assert turn_order(3, 5) == [2, 1, 0]
    firsts = [turn_order(4, r)[0] for r in range(8)]
    assert sorted(firsts) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(sorted(turn_order(n, r)) == list(range(n)) for n in range(1, 10) for r in range(40))
    for n in (3, 8, 9):
        before = {a: set() for a in range(n)}
        for r in range(4 * n):
            order = turn_order(n, r)
            for prev, this in zip(order, order[1:]):
                before[this].add(prev)
        assert all(len(seen) >= 2 for seen in before.values()), before
