"""Time from a worker's kill -9 to the survivors' first completed step, in process (docs/elastic.md).

Runs tests/elastic/workers/elastic_train.py (torch, DistributedOptimizer, TorchState, ElasticSampler) under
``commlib-run --emulate 3x1 --min-np 2`` with rank 1 killing itself at step 10, ``--runs`` times for each
``--timeouts`` value of COMMLIB_TIMEOUT, and prints per run, in seconds after the kill: the first
survivor's report, the driver's decision, the survivors' training function starting again, their first
completed step; and the load average. Run it alone (``/work/notes/bin/quiet`` on a shared machine).

    python scripts/bench_elastic.py --runs 2 --timeouts 3 10
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def one(timeout_s: float) -> dict:
    from test_elastic import _remove_shared_memory_left, _replay

    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as tmp:
        logs, state = Path(tmp, "logs"), Path(tmp, "state")
        logs.mkdir()
        state.mkdir()
        env = dict(os.environ, PYTHONPATH=str(REPO), ELASTIC_KILL_AT="10", COMMLIB_TIMEOUT=str(timeout_s),
                   COMMLIB_ELASTIC_DIR=str(state))
        try:
            done = subprocess.run([sys.executable, "-m", "commlib.run", "--emulate", "3x1", "--min-np", "2",
                                   "--max-np", "3", sys.executable, str(REPO / "tests/elastic/workers/elastic_train.py"),
                                   str(logs)], capture_output=True, text=True, timeout=400, env=env, cwd=REPO)
        finally:
            _remove_shared_memory_left(logs)
        if done.returncode != 0:
            raise SystemExit(f"the elastic job failed ({done.returncode}):\n{done.stderr[-3000:]}")
        killed = float((logs / "killed").read_text())
        reports = [json.loads(p.read_text())["time"] for p in state.glob("report.0.*")]
        decision = (state / "members.0").stat().st_mtime
        launches, _ = _replay(logs)
        assert [l["size"] for l in launches] == [3, 2], launches
        return {"timeout_s": timeout_s, "report_s": min(reports) - killed, "decision_s": decision - killed,
                "restart_s": launches[1]["start"] - killed, "first_step_s": launches[1]["first_step_time"] - killed,
                "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--timeouts", type=float, nargs="+", default=[3.0])
    args = parser.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; uptime: {os.popen('uptime').read().strip()}")
    print("COMMLIB_TIMEOUT  report  decision  training again  first step done  load1")
    for _ in range(args.runs):
        for timeout_s in args.timeouts:  # interleaved
            r = one(timeout_s)
            print(f"{r['timeout_s']:>15g}  {r['report_s']:6.2f}  {r['decision_s']:8.2f}  {r['restart_s']:14.2f}  "
                  f"{r['first_step_s']:15.2f}  {r['load']:5.2f}", flush=True)


if __name__ == "__main__":
    main()
