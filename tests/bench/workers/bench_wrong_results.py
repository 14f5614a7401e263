"""commlib-bench's core measuring a collective whose results are really wrong: it must print the table,
count the wrong elements and exit non-zero.

The collective below is a plain allreduce table whose run step reduces with Max although the check
expects Sum (the kind of bug the check exists to catch). Everything else - the Engine, MPI, the check,
the table and the exit status - is the real tool's. Arguments: commlib-bench flags.
"""

import sys

from mpi4py import MPI

from commlib.bench.allreduce import Allreduce
from commlib.bench.cli import run
from commlib.bench.options import parse_options
from commlib.ops import ReduceOp


class MaxInsteadOfSum(Allreduce):
    def run(self, engine, send, layout, op, algorithm, codec, root):
        engine.allreduce_(send, ReduceOp.MAX, algorithm=algorithm, codec=codec)
        return send


if __name__ == "__main__":
    sys.exit(run(parse_options(sys.argv[1:]), MPI.COMM_WORLD, collective=MaxInsteadOfSum()))
