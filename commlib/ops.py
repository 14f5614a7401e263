"""Reduction operations, named as in horovod.torch (``Sum``, ``Average``, ...)."""

import enum


class ReduceOp(enum.IntEnum):
    """A reduction. ``Average`` is a sum followed by a division by the number of ranks."""

    SUM = 0
    AVERAGE = 1
    MIN = 2
    MAX = 3
    PRODUCT = 4

    @property
    def kernel_op(self) -> "ReduceOp":
        """The elementwise operation the kernels run (Average reduces as a sum)."""
        return ReduceOp.SUM if self is ReduceOp.AVERAGE else self


Sum = ReduceOp.SUM
Average = ReduceOp.AVERAGE
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


def as_op(op) -> ReduceOp:
    """Accept a ReduceOp, its name ("sum", "Average", ...) or its integer value."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        try:
            return ReduceOp[op.upper()]
        except KeyError:
            pass
    elif isinstance(op, int):
        try:
            return ReduceOp(op)
        except ValueError:
            pass
    names = ", ".join(o.name.lower() for o in ReduceOp)
    raise ValueError(f"unknown reduction op {op!r}; use one of: {names}")
