"""Process queries for TensorFlow: horovod.tensorflow's names, plus their ``*_op`` tensor forms."""

from __future__ import annotations

import tensorflow as tf

import commlib as _cl
from .. import lifecycle
from ..frameworks.basics import (ProcessSet, add_process_set, ccl_built, cross_rank, cross_size,  # noqa: F401
                                 cuda_built, ddl_built, global_process_set, gloo_built, gloo_enabled, init,
                                 is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
                                 mpi_threads_supported, nccl_built, rank, remove_process_set, rocm_built,
                                 shutdown, size, start_timeline, stop_timeline)


def is_homogeneous() -> bool:
    """True when every node runs the same number of ranks."""
    return _cl.size() == _cl.local_size() * _cl.cross_size()


def _set(process_set_id: int):
    """The registered process set with this id (also one this rank is not part of)."""
    if process_set_id == 0:
        return global_process_set
    found = lifecycle.current().sets.by_id(process_set_id)
    if found is None:
        raise ValueError(f"process set {process_set_id} is not registered")
    return found


def rank_op(name=None) -> tf.Tensor:
    """This rank, as an int32 tensor."""
    return tf.constant(_cl.rank(), tf.int32, name=name)


def local_rank_op(name=None) -> tf.Tensor:
    return tf.constant(_cl.local_rank(), tf.int32, name=name)


def size_op(process_set_id: int = 0, name=None) -> tf.Tensor:
    """The number of ranks (of the process set with this id), as an int32 tensor."""
    members = len(_set(process_set_id).ranks) if process_set_id else _cl.size()
    return tf.constant(members, tf.int32, name=name)


def local_size_op(name=None) -> tf.Tensor:
    return tf.constant(_cl.local_size(), tf.int32, name=name)


def process_set_included_op(process_set_id: int = 0, name=None) -> tf.Tensor:
    """1 if this rank belongs to the process set with this id, else 0 (an int32 tensor)."""
    if process_set_id == 0:
        return tf.constant(1, tf.int32, name=name)
    included = _cl.rank() in _set(process_set_id).ranks
    return tf.constant(int(included), tf.int32, name=name)
