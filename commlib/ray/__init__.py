"""commlib on Ray: Horovod on Ray's ``RayExecutor`` (and ``ElasticRayExecutor``) running commlib jobs in
Ray actors, and a Ray Train backend (:mod:`commlib.ray.train`). docs/launcher.md, "Ray".

    from commlib.ray import RayExecutor        # where Horovod's scripts say: from horovod.ray import ...

Needs Ray (``pip install commlib[ray]``); importing this package imports it.
"""

try:
    import ray as _ray  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("commlib.ray needs Ray: pip install 'commlib[ray]'") from exc

from . import ray_logger
from .elastic import ElasticRayExecutor
from .executor import RayExecutor
from .worker import Worker as BaseHorovodWorker, create_settings

__all__ = ["RayExecutor", "ElasticRayExecutor", "BaseHorovodWorker", "create_settings", "ray_logger"]
