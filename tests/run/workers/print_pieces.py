"""A rank that writes its lines in pieces (tests/run/test_launcher_output.py): LINES lines to stdout, each
in three writes (with PYTHONUNBUFFERED=1 each is a write of its own), every seventh line a line to stderr in
two writes, and LONG lines of 10,000 bytes. Each line names its rank and number, so the test can tell a
whole line from a cut or mixed one. No MPI: the launcher's variables give the rank."""

import os
import sys

rank = next((os.environ[v] for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK") if v in os.environ), "?")
lines, long = int(sys.argv[1]), int(sys.argv[2])
for i in range(lines):
    print(f"RUN {rank} {i:05d}", end="")
    print(" piece-two", end="")
    print(" piece-three-" + "x" * (i % 50))
    if i % 7 == 0:
        print(f"ERR {rank} {i:05d}", end="", file=sys.stderr)
        print(" tail", file=sys.stderr)
for i in range(long):
    print(f"LONG {rank} {i:05d} " + "y" * 10000)
