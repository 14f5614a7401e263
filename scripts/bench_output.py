"""What labelling whole lines costs (docs/launcher.md, "Output"): commlib-run's way against hydra's own.

Interleaved, ``--runs`` times each, on this host with hydra, 4 ranks each printing ``--lines`` lines of 60
bytes (block-buffered, and with PYTHONUNBUFFERED=1, each line in three writes), output to /dev/null:

- ``hydra``: ``mpiexec -prepend-rank -n 4 python prog`` (what commlib-run ran before: cut lines);
- ``labelled``: ``mpiexec -n 4 python -I commlib/run/output.py -- python prog``, its output passed through
  the relays commlib-run uses (commlib.run.output.relays) in one further process, which loads output.py
  alone (commlib-run has imported it, with the commlib package, before and after this change alike);

and the same with 0 lines (the start-up cost: one more Python per rank, and the relay's). Prints the
median wall time of each and the difference per line, less the start-up difference. commlib-run's own start (importing commlib.run) is the same in both and
not counted. Run it alone (``flock -x /tmp/commlib-cpu.lock``): timings drift with the machine's load.

    python scripts/bench_output.py --runs 5 --lines 200000
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROGRAM = r"""
import sys
n, pieces = int(sys.argv[1]), sys.argv[2] == "pieces"
for i in range(n):
    if pieces:
        print(f"line {i:08d}", end=""); print(" of the rank's", end=""); print(" output " + "x" * 24)
    else:
        print(f"line {i:08d} of the rank's output " + "x" * 24)
"""
RELAY = r"""
import importlib.util, subprocess, sys
spec = importlib.util.spec_from_file_location("output", sys.argv.pop(1))  # not through the commlib package,
output = importlib.util.module_from_spec(spec)                              # whose import commlib-run pays
spec.loader.exec_module(output)                                             # before and after alike
job = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
threads = output.relays(job)
code = job.wait()
for t in threads:
    t.join()
sys.exit(code)
"""


def mpiexec() -> str:
    sys.path.insert(0, str(REPO))
    from commlib.testing.cluster import find_mpiexec

    return find_mpiexec()


def timed(argv: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lines", type=int, default=200000)
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    from commlib.run.output import SCRIPT

    python, launcher = sys.executable, mpiexec()
    ways = {
        "hydra": lambda prog: [launcher, "-prepend-rank", "-n", str(args.ranks), python, "-c", PROGRAM, *prog],
        "labelled": lambda prog: [python, "-c", RELAY, SCRIPT, launcher, "-n", str(args.ranks), python, "-I", SCRIPT,
                                  "--", python, "-c", PROGRAM, *prog],
    }
    cases = [("start-up (0 lines)", ["0", "whole"], {}),
             (f"{args.lines} lines/rank, buffered", [str(args.lines), "whole"], {}),
             (f"{args.lines} lines/rank, PYTHONUNBUFFERED=1, 3 writes/line", [str(args.lines), "pieces"],
              {"PYTHONUNBUFFERED": "1"})]
    base = dict(os.environ, PYTHONPATH=str(REPO))
    base.pop("PYTHONUNBUFFERED", None)
    print(f"# {args.ranks} ranks on this host, hydra ({launcher}); median of {args.runs} interleaved runs; "
          f"load average {os.getloadavg()[0]:.2f} at start")
    start_up = 0.0
    for title, prog, extra in cases:
        times = {way: [] for way in ways}
        for _ in range(args.runs):
            for way, argv in ways.items():
                times[way].append(timed(argv(prog), dict(base, **extra)))
        hydra, labelled = statistics.median(times["hydra"]), statistics.median(times["labelled"])
        lines = args.ranks * int(prog[0])
        if not lines:
            start_up = labelled - hydra
        per_line = f"; less the start-up, {1e6 * (labelled - hydra - start_up) / lines:+.2f} us per line" \
            if lines else ""
        print(f"{title}: hydra -prepend-rank {hydra:.3f} s, labelled {labelled:.3f} s "
              f"({labelled - hydra:+.3f} s{per_line})", flush=True)
    print(f"# load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
