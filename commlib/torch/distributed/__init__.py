"""The ``commlib`` backend of torch.distributed: DDP, FSDP and every ``dist.*`` call on commlib.

``import commlib.torch`` (or nothing, where commlib is installed: torch loads it through its
``torch.backends`` entry point) registers the name, so a torch.distributed script runs on commlib by
naming it::

    dist.init_process_group("commlib")       # under mpiexec, commlib-run, srun or torchrun
    model = DistributedDataParallel(model)   # buckets become commlib allreduces

``ProcessGroupCommlib`` (:mod:`.process_group`) maps each c10d call to commlib requests, ``Work``
(:mod:`.work`) is c10d's Work over commlib's handles, ``Options`` (:mod:`.options`) a group's algorithm,
compression and commlib settings. See docs/torch.md, "Using commlib from torch.distributed".
"""

from .options import Options
from .process_group import BACKEND_NAME, ProcessGroupCommlib
from .registration import register
from .work import CollectiveTimeoutError, Work

register()

__all__ = ["BACKEND_NAME", "CollectiveTimeoutError", "Options", "ProcessGroupCommlib", "Work", "register"]
