"""The one dtype table and the validation rules that read it (no MPI job needed)."""

import numpy as np
import pytest

from commlib import kernels, validation
from commlib.dtypes import BY_NUMPY, CODES, REDUCIBLE, TABLE
from commlib.errors import CommlibError, UnsupportedDtypeError
from commlib.ops import ReduceOp

# Horovod's torch binding (adapter_v2.cc), plus bfloat16 (commlib's own) and bool (the numpy API reduces it
# as numpy does; commlib.torch refuses it, as Horovod's torch binding does).
HOROVOD_TORCH = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")


def test_the_table_covers_horovods_torch_dtypes_once():
    assert sorted(row.torch for row in TABLE) == sorted(HOROVOD_TORCH + ("bfloat16", "bool"))
    assert len(set(CODES.values())) == len(TABLE) == len(REDUCIBLE)


def test_every_row_names_real_types():
    torch = pytest.importorskip("torch")
    from mpi4py import MPI

    for row in TABLE:
        assert getattr(torch, row.torch).itemsize == row.numpy.itemsize, row
        if row.mpi is not None:
            assert getattr(MPI, row.mpi).Get_size() == row.numpy.itemsize, row
        assert kernels.dtype_code(row.numpy) == row.code


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
def test_each_dtype_reduces_through_the_kernels(row):
    a = np.array([0, 1, 1, 0, 1], dtype=np.float64).astype(row.numpy)
    b = np.array([0, 0, 1, 1, 1], dtype=np.float64).astype(row.numpy)
    for op, want in ((ReduceOp.SUM, [0, 1, 2, 1, 2]), (ReduceOp.MIN, [0, 0, 1, 0, 1]), (ReduceOp.MAX, [0, 1, 1, 1, 1])):
        got = a.copy()
        kernels.reduce_(got, b, op)
        expected = np.array(want, np.float64)
        if row.kind == "bool":
            expected = expected > 0
        np.testing.assert_array_equal(got.astype(np.float64), expected.astype(np.float64), err_msg=f"{row.name} {op}")


def test_rules_by_kind():
    for row in TABLE:
        average = validation.reduction(row.numpy, ReduceOp.AVERAGE, "t")
        scaled = validation.scaling(row.numpy, 0.5, 1.0, "t")
        if row.kind == "bool":
            assert "Average" in average and "bool" in scaled
        else:  # floats, and integers as Horovod (float64 product, truncated)
            assert average == "" and scaled == ""
    assert "complex64" in validation.reduction(np.dtype(np.complex64), ReduceOp.SUM, "t")
    known = ("auto", "ring")
    assert validation.algorithm("RING", known) == "" and "fastest" in validation.algorithm("fastest", known)
    assert "must be a string" in validation.algorithm(3, known)
    assert "not contiguous" in validation.contiguous(np.zeros((4, 4))[:, 1], "t")
    with pytest.raises(UnsupportedDtypeError):
        validation.check_reducible(np.zeros(2, np.complex64), ReduceOp.SUM)
    with pytest.raises(CommlibError, match="read-only"):
        ro = np.zeros(2)
        ro.flags.writeable = False
        validation.check_writable(ro)
    assert BY_NUMPY[np.dtype(np.int16)].mpi == "INT16_T"
