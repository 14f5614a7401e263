"""Many process sets x lanes x half dtypes x ops through MPI's own allreduce: the user-defined MPI ops that
reduce half types are shared by every transport of the runtime (mpi4py allows only 32 at once)."""

import ml_dtypes
import numpy as np

import commlib as cl
import spmd


@spmd.case
def half_types_in_every_set_and_lane():
    cl.init(num_streams=2)
    r, n = cl.rank(), cl.size()
    sets = [cl.add_process_set([i for i in range(n) if i != k]) for k in range(n)] if n > 2 else []
    for ps in [None] + sets:
        if ps is not None and not ps.included():
            continue
        m = n if ps is None else ps.size()
        for dt in (np.float16, ml_dtypes.bfloat16):
            for op in (cl.Sum, cl.Min, cl.Max, cl.Product):
                got = cl.allreduce(np.ones(8, dt), op=op, algorithm="native", process_set=ps)
                assert np.all(got.astype(np.float32) == (m if op is cl.Sum else 1)), (r, op, got)
    cl.shutdown()


if __name__ == "__main__":
    spmd.main()
