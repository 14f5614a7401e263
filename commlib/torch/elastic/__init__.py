"""``horovod.torch.elastic`` on commlib: ``run``, ``TorchState``, ``ObjectState``, ``ElasticSampler``,
``HostsUpdatedInterrupt``. Recovery is by restart under commlib-run's elastic driver (docs/elastic.md)."""

from ...elastic import HorovodInternalError, HostsUpdatedInterrupt, ObjectState, State, run, run_fn
from .sampler import ElasticSampler
from .state import TorchState

__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState",
           "run", "run_fn"]
