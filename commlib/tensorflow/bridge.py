"""Running commlib's numpy collectives from TensorFlow: eagerly, inside ``tf.function`` and in TF1 graphs.

Eagerly, a collective takes each tensor's numpy value, calls commlib and wraps the result. In a graph it
is one ``tf.numpy_function`` (stateful, so ``tf.function`` keeps the collectives in program order on every
rank) whose Python body does the same. A body waits for the collective inside commlib, which releases
the GIL; a list of tensors travels in one body (one grouped collective), so a gradient list holds one of
TensorFlow's inter-op threads, not one per gradient.

Errors keep Horovod's types: a collective that fails between ranks (shapes, dtypes or ops that differ, a
rank that left) is ``tf.errors.FailedPreconditionError``; a bad argument found on this rank is
``tf.errors.InvalidArgumentError``. XLA cannot compile a Python body, so ``jit_compile=True`` fails
with TensorFlow's own error naming the ``PyFunc`` op, never hangs; a SavedModel cannot carry the body.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from tensorflow.python.framework.func_graph import FuncGraph

from ..errors import CollectiveError, CommlibError

def numpy_dtype(dtype: tf.DType) -> np.dtype:
    """The numpy dtype of a TensorFlow dtype (bfloat16: ml_dtypes', which commlib reduces)."""
    return np.dtype(tf.as_dtype(dtype).as_numpy_dtype)


def executing_eagerly() -> bool:
    """True eagerly, False while building a ``tf.function`` or a TF1 graph."""
    return tf.executing_eagerly()


def op_name(name: str | None, operation: str) -> str | None:
    """The name a collective is negotiated under. Eagerly, None: commlib counts unnamed calls, which run in
    the same order on every rank. In a graph the name is fixed when the graph is built: ``name`` if given,
    else a name unique in that graph (the same on every rank, which build the same graph)."""
    if name is not None or executing_eagerly():
        return name
    graph = tf.compat.v1.get_default_graph()
    prefix = getattr(graph, "name", None) or "graph"
    return graph.unique_name(f"commlib.{prefix}.{operation}", mark_as_used=True)


def tf_error(exc: BaseException) -> BaseException:
    """The TensorFlow error Horovod raises for ``exc`` (the exception itself when it has no counterpart)."""
    if isinstance(exc, tf.errors.OpError):
        return exc
    if isinstance(exc, CollectiveError):
        if " is invalid on some ranks: " in str(exc):  # an argument every rank checked and some refused
            return tf.errors.InvalidArgumentError(None, None, str(exc))
        return tf.errors.FailedPreconditionError(None, None, str(exc))
    if isinstance(exc, (ValueError, TypeError)) or (isinstance(exc, CommlibError)
                                                   and not isinstance(exc, NotImplementedError)):
        return tf.errors.InvalidArgumentError(None, None, str(exc))
    return exc


def _guarded(fn: Callable) -> Callable:
    def body(*arrays):
        try:
            return fn(*arrays)
        except Exception as exc:
            error = tf_error(exc)
            if error is exc:
                raise
            raise error from None
    return body


#: The last collective op of each TF1 graph (see :func:`_in_order`).
_last_op: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _in_order(inputs):
    """Control dependencies that run a TF1 graph's collectives in the order they were created.

    A TF1 graph runs independent ops on a few inter-op threads in any order, and each collective op
    blocks its thread until every rank submitted it: two ranks running different collectives on all
    their threads would wait for each other forever. Chained, every rank runs them in one order. (A
    ``tf.function`` needs no chain: it runs stateful ops in program order already.)"""
    graph = tf.compat.v1.get_default_graph()
    last = _last_op.get(graph)
    if isinstance(graph, FuncGraph) or last is None:
        return contextlib.nullcontext()
    return tf.control_dependencies([last])


def _failed_precondition(failed: tf.Tensor, label: str) -> tf.Tensor:
    """An op that raises ``tf.errors.FailedPreconditionError`` when ``failed`` is nonzero.

    A Python body can only raise the error codes TensorFlow maps from Python exceptions (ValueError is
    InvalidArgument, NotImplementedError Unimplemented, anything else Unknown). Horovod's code for a
    collective that failed between ranks is FailedPrecondition, which a graph raises when it reads a
    variable that does not exist: the branch taken on failure reads one named after the collective. The
    body has already logged the reason on each rank."""
    def raise_error():
        handle = tf.raw_ops.VarHandleOp(dtype=tf.int32, shape=[], shared_name=label)
        return tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int32)
    return tf.cond(failed > 0, raise_error, lambda: tf.constant(0, tf.int32))


def run(fn: Callable[..., Sequence[np.ndarray]], inputs: Sequence, out_dtypes: Sequence[tf.DType],
        out_shapes: Sequence, name: str = "commlib", label: str | None = None) -> list:
    """``fn(*arrays) -> arrays`` on ``inputs``' values; eagerly at once, in a graph as one op.

    ``out_shapes``: what is known of each output's shape (a list with None for unknown dimensions);
    ``label``: the collective's name, for the error a graph raises when it fails between ranks."""
    body = _guarded(fn)
    if executing_eagerly():
        outs = body(*[np.asarray(t) if isinstance(t, np.ndarray) else t.numpy() for t in inputs])
        return [tf.convert_to_tensor(np.asarray(o, dtype=numpy_dtype(d)), dtype=d)
                for o, d in zip(outs, out_dtypes)]

    def graph_body(*arrays):
        try:
            outs = [np.asarray(o, dtype=numpy_dtype(d)) for o, d in zip(fn(*arrays), out_dtypes)]
            return outs + [np.int32(0)]
        except CollectiveError as exc:
            if " is invalid on some ranks: " in str(exc):
                raise ValueError(str(exc)) from None  # TensorFlow's InvalidArgument
            print(f"commlib: FailedPreconditionError: {exc}", file=sys.stderr, flush=True)
            return [np.zeros([0], numpy_dtype(d)) for d in out_dtypes] + [np.int32(1)]
        except Exception as exc:
            error = tf_error(exc)
            if isinstance(error, tf.errors.InvalidArgumentError):
                raise ValueError(str(exc)) from None  # TensorFlow's InvalidArgument
            raise

    with _in_order(list(inputs)):
        outs = tf.numpy_function(graph_body, list(inputs), list(out_dtypes) + [tf.int32], stateful=True,
                                 name=name)
    outs = list(outs)
    _last_op[tf.compat.v1.get_default_graph()] = outs[-1].op
    failed = outs.pop()
    failed.set_shape([])
    check = _failed_precondition(failed, f"commlib collective {label or name} failed between ranks: "
                                         "FailedPreconditionError, the reason is logged above by each rank")
    with tf.control_dependencies([check]):
        outs = [tf.identity(o) for o in outs]
    for out, shape in zip(outs, out_shapes):
        out.set_shape(shape)
    return outs
