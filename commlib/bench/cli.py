"""``commlib-bench``: run under mpiexec; rank 0 prints the table and writes --json/--plot.

Exit status: 0 when every checked value was right, 1 when any was wrong (after the table is printed),
2 for a bad command line. An error on any rank aborts the whole job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shlex
import sys
import traceback

from . import calibrate as calibration
from . import device as device_bench
from . import progress as progress_bar
from . import report
from ..algorithms import cost, select, spec
from .core import codec_of
from .collectives import collective as make_collective
from .core import refusals, run_sweep
from .lane import open_lane
from .options import Options, parse_options


def _commlib_version() -> str:
    import commlib

    return commlib.__version__


def _parse_on_every_rank(argv: list[str], rank: int) -> Options | int:
    """Options, or the exit status of argparse (help or a usage error), printed by rank 0 only."""
    quiet = rank != 0
    sink = io.StringIO()
    with contextlib.ExitStack() as stack:
        if quiet:
            stack.enter_context(contextlib.redirect_stdout(sink))
            stack.enter_context(contextlib.redirect_stderr(sink))
        try:
            return parse_options(argv)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 2


def _launcher_rank() -> int:
    """This process's rank as the launcher tells it, known before MPI starts (0 if none says)."""
    for variable in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(variable, "").isdigit():
            return int(os.environ[variable])
    return 0


def _job_errors(options: Options, nranks: int) -> list[str]:
    """Problems only visible once the job runs (the same verdict on every rank)."""
    errors = []
    if options.root >= nranks:
        errors.append(f"-r/--root {options.root} is not a rank of this {nranks}-rank job")
    if options.plot_path:
        try:
            report.check_plot_available()
        except report.PlotUnavailable as exc:
            errors.append(str(exc))
    return errors


def run(options: Options, comm, collective=None, command: str = "commlib-bench", servers=None) -> int:
    """Run the sweep of ``options`` on ``comm`` (collective); rank 0 prints. Returns the exit status.

    ``collective`` defaults to the one named by ``options.collective``; passing another
    :class:`~commlib.bench.collective.Collective` measures it with the same core. ``servers``: the job's
    layout (``commlib.server.discovery.Job``) when it has summation servers, so that ``ps`` runs (and
    ``--calibrate`` measures the servers' links)."""
    rank = comm.Get_rank()
    collective = collective if collective is not None else make_collective(options.collective)
    config = options.config()
    lane = open_lane(comm, config)
    client = None
    if servers is not None and servers.servers:
        from ..server.client import ServerLane, open_client

        client = open_client(servers, config.server_partition_bytes, config.server_timeout_s,
                             config.server_tcp_congestion, config.server_tcp_rcvbuf)
        nodes = client.server_nodes(list(servers.workers), lane.topology.node_of_rank)
        lane.engine.context.servers = ServerLane(client, "commlib-bench", comm.Get_size(), nodes)
    lane.engine.recall()  # auto starts from what earlier jobs of this layout settled, as a job's would
    try:
        if options.device == "cuda":  # device buffers: a table of its own (bench/device.py)
            return device_bench.run(options, comm, lane, command)
        refused = refusals(options, collective, lane.engine)
        error = _refusal_error(options, refused)
        if error:
            if rank == 0:
                print(error, file=sys.stderr)
            return 2
        options = dataclasses.replace(options, algorithms=tuple(a for a in options.algorithms if a not in refused))
        if options.calibrate_path is not None:
            _calibrate(options, comm, lane, command)
        info = _run_info(options, collective, comm, lane, refused, command)
        bar = None
        if rank == 0 and progress_bar.wanted(options.progress):
            bar = progress_bar.ProgressBar(f"commlib-bench {collective.name}")
        if rank == 0:
            print("\n".join(report.header(info)), flush=True)
        results = []
        for result in run_sweep(options, collective, comm, lane.engine, progress=bar):
            if rank == 0:
                if bar is not None:
                    bar.finish()
                result = _annotate(result, options, lane, info)
                print(report.row(result, info), flush=True)
            results.append(result)
        if rank == 0:
            learning = select.learner(lane.engine.context)
            if options.explain and learning is not None:
                info = dataclasses.replace(info, learned=learning.summary())
            _write_outputs(options, results, info)
        comm.Barrier()
        return 1 if report.total_wrong(results) else 0
    finally:
        if client is not None:
            client.close()
        lane.close()


def _calibrate(options: Options, comm, lane, command: str) -> None:
    """Fit the cost model on this job, write the profile (rank 0) and use it for this run's ``auto``."""
    model, measured = calibration.calibrate(lane.engine, comm)
    lane.engine.use_model(model)  # every rank fitted the same numbers
    ctx = lane.engine.context
    if comm.Get_rank() == 0:
        path = options.calibrate_path or _profile_target(ctx.config.tuning_file)
        cost.write_profile(path, calibration.document(model, select.shape_of(ctx), measured, command))
        print("\n".join(calibration.describe(model)) + f"\n# tuning profile written to {path}", flush=True)
        print(f"# use it: export COMMLIB_TUNING_FILE={path}" if options.calibrate_path else
              "# auto reads it from there by default", flush=True)


def _profile_target(setting: str | None) -> str:
    """Where --calibrate without FILE writes: COMMLIB_TUNING_FILE, else the default location."""
    if setting and setting.strip().lower() != "none":
        return os.path.expanduser(setting)
    return str(cost.default_profile_path())


def _annotate(result, options: Options, lane, info: report.RunInfo):
    """Rank 0: what auto ran, the model's prediction (--explain) and the multiple of the link bound."""
    ctx = lane.engine.context
    codec = codec_of(options)
    shape = select.shape_of(ctx)
    bound = (cost.link_bound(result.nbytes, lane.topology.cross_size, options.link_rate, codec)
             if options.link_rate else 0.0)
    measurements = []
    for m in result.measurements:
        chosen = predicted = None
        if m.algorithm == "auto":  # what it runs after this size's calls: learned, or the model's choice
            choice = select.current(ctx, result.nbytes, codec)
            chosen, predicted = choice.algorithm, choice.predicted_s
        elif m.algorithm in spec.BY_NAME:
            predicted = spec.get(m.algorithm).cost(ctx.cost_model, result.nbytes, shape, codec,
                                                   ctx.config.ring_segment_bytes)
        predicted_us = predicted * 1e6 if options.explain and predicted not in (None, cost.INF) else None
        measurements.append(dataclasses.replace(
            m, chosen=chosen, predicted_us=predicted_us, x_bound=m.time_us * 1e-6 / bound if bound else None))
    return dataclasses.replace(result, measurements=tuple(measurements))


def _refusal_error(options: Options, refused: dict[str, str]) -> str | None:
    """An error message when an algorithm the user named cannot run, or none of ``all`` can."""
    if refused and not options.all_algorithms:
        return "\n".join(f"commlib-bench: error: {algorithm} cannot run here: {reason}"
                         for algorithm, reason in refused.items())
    if len(refused) == len(options.algorithms):
        return "commlib-bench: error: no algorithm of --algo all can run here"
    return None


def _run_info(options: Options, collective, comm, lane, refused: dict[str, str], command: str) -> report.RunInfo:
    topology, config = lane.topology, lane.engine.config
    return report.RunInfo(
        collective=collective.name, commlib_version=_commlib_version(), mpi_version=_mpi_version(),
        ranks=comm.Get_size(), nodes=topology.cross_size, node_sizes=topology.node_sizes,
        local_size_emulated=config.local_size is not None, dtype=options.dtype_name,
        op=options.op_name if collective.reduces else "none",
        iters=options.iters, warmup_iters=options.warmup_iters, rounds=options.rounds, check=options.check,
        auto_warmup=options.auto_warmup, min_time=options.min_time,
        compression=options.compression,
        torus="x".join(map(str, config.torus_shape)) if config.torus_shape else None,
        algorithms=options.algorithms, skipped=refused, load_average=_load_average(), command=command,
        link_rate=options.link_rate, explain=options.explain,
        model=(calibration.describe(lane.engine.context.cost_model)
               + [f"# fusion: tensors under {lane.engine.fusion_inplace_bytes} B are packed (COMMLIB_FUSION_INPLACE"
                  + (f"; under {select.pass_limit(lane.engine.context.cost_model)} B in a group cma reduces)"
                     if config.fusion_inplace_bytes is None else ")")]
               if options.explain else []))


def _write_outputs(options: Options, results, info: report.RunInfo) -> None:
    """Rank 0: the footer, then --json and --plot."""
    print("\n".join(report.footer(results, info)), flush=True)
    if info.learned:
        print("\n".join(["#", "# What auto learned (per size class: each candidate's fastest agreed call, "
                                "the model's prediction; COMMLIB_AUTO_LEARN=0 turns learning off)"]
                        + [f"# {line}" for line in info.learned]), flush=True)
    if options.json_path:
        report.write_json(options.json_path, results, info)
        print(f"# JSON written to {options.json_path}", flush=True)
    if options.plot_path:
        report.write_plot(options.plot_path, results, info)
        print(f"# plot written to {options.plot_path}", flush=True)


def _load_average() -> float | None:
    """Other processes on the machine skew timings; the header says how busy it was."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _mpi_version() -> str:
    from mpi4py import MPI

    return " ".join(MPI.Get_library_version().strip().splitlines()[0].split())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``commlib-bench`` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    options = _parse_on_every_rank(argv, _launcher_rank())  # before MPI: --help starts none
    if isinstance(options, int):
        return options
    from mpi4py import MPI

    from ..server import discovery

    # summation servers launched in the same job (MPMD) are split off; the benchmark runs on the workers
    layout = discovery.job(MPI.COMM_WORLD, discovery.WORKER, options.config().start_timeout_s)
    comm = layout.own
    rank = comm.Get_rank()
    errors = _job_errors(options, comm.Get_size())
    if errors:
        if rank == 0:
            for error in errors:
                print(f"commlib-bench: error: {error}", file=sys.stderr)
        return 2
    try:
        return run(options, comm, command=shlex.join(["commlib-bench", *argv]), servers=layout)
    except Exception:  # one rank failing would leave the others waiting: stop the whole job
        sys.stderr.write(f"commlib-bench: rank {rank} failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
        comm.Abort(1)
        return 1


if __name__ == "__main__":
    sys.exit(main())
