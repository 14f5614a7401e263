"""commlib for JAX: ``import commlib.jax as cj``.

Collectives on ``jax.Array``s that work eagerly and inside ``jax.jit`` (also in ``lax.scan``, ``while_loop``
and ``cond`` bodies), in program order on every rank, differentiable where that makes sense; the optax
wrappers ``DistributedOptimizer``, ``distributed_gradients`` and ``LocalSGD``; and the broadcast helpers.
Every call goes through commlib's coordinator, fusion, algorithms and compressors. See docs/jax.md.
"""

try:
    import jax as _jax  # noqa: F401
except ImportError as _exc:  # say what to install instead of a bare ModuleNotFoundError deep inside
    raise ImportError("commlib.jax needs JAX: pip install 'commlib[jax]' (installs jax, jaxlib and optax), "
                      f"or pip install jax optax ({_exc})") from _exc

from ..compression import Compression
from ..errors import CollectiveError, CommlibError
from ..ops import Average, Max, Min, Product, ReduceOp, Sum
from ..api import ProcessSet
from .basics import (add_process_set, cross_rank, cross_size, global_process_set, init, is_initialized,
                     local_rank, local_size, rank, remove_process_set, shutdown, size)
from .collectives import (Handle, allgather, allreduce, allreduce_async, alltoall, barrier, broadcast,
                          grouped_allreduce, grouped_allreduce_async, overlapped_allreduce, reducescatter,
                          synchronize)
from .functions import allgather_object, broadcast_object, broadcast_parameters
from .optimizer import DistributedOptimizer, LocalSGD, distributed_gradients
