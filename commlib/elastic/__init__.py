"""Elastic training, framework-neutral: state that survives a lost worker, and the run loop.

``commlib.elastic.run``, :class:`State`, :class:`ObjectState`, :class:`HostsUpdatedInterrupt` follow
Horovod Elastic's API; ``commlib.torch.elastic`` adds ``TorchState`` and ``ElasticSampler``. Under commlib-run's
elastic driver (``commlib-run --min-np/--max-np``, docs/elastic.md) the survivors of a lost rank go on in
process (:mod:`.recover`); added hosts, and MPIs that cannot keep the survivors running, restart the job.
"""

from ..errors import CollectiveError as HorovodInternalError
from .control import RESTART_EXIT_CODE
from .run import run, run_fn
from .state import HostsUpdatedInterrupt, ObjectState, State

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "RESTART_EXIT_CODE", "State", "run",
           "run_fn"]
