"""The ``commlib`` backend's options: per process group, given as ``pg_options`` to ``init_process_group``
or ``new_group``.

``algorithm`` and ``compression`` apply to the group's ``all_reduce`` (DDP's buckets included; the
compressors run on float32 with SUM or AVG); ``settings`` are ``commlib.init`` settings (fusion threshold,
cycle time, ...: docs/configuration.md) and apply to the whole job, so only the default group, the one that
starts commlib, takes them. Left at None, each comes from the ``COMMLIB_*`` variables (COMMLIB_ALGORITHM,
COMMLIB_TORCH_COMPRESSION, COMMLIB_FUSION_THRESHOLD, ...), parsed by :mod:`commlib.config`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...compression import Compression, Compressor, NoCompression, WireCodec
from ...config import WIRE_COMPRESSIONS, algorithm_names
from ...errors import ConfigError
from ... import validation


@dataclasses.dataclass
class Options:
    """Options of one ``commlib`` process group.

    - ``algorithm``: the allreduce algorithm (``"auto"``, ``"ring"``, ``"hierarchical"``, ...; docs/algorithms.md).
    - ``compression``: ``"none"``, ``"fp16"``, ``"bf16"``, a ``commlib.Compression`` member, or a lossy
      compressor (``Compression.topk(0.01)``, ``.dgc()``, ``.powersgd()``, ``.onebit()``; docs/compression.md).
    - ``settings``: ``commlib.init`` settings for the job (default group only), e.g.
      ``{"fusion_threshold_bytes": 32 << 20}``.

    Example::

        from commlib.torch.distributed import Options
        dist.init_process_group("commlib", pg_options=Options(compression="fp16"))
    """

    algorithm: str | None = None
    compression: Any = None
    settings: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.algorithm is not None:
            error = validation.algorithm(self.algorithm, algorithm_names())
            if error:
                raise ConfigError(f"commlib backend Options: {error}")
            self.algorithm = str(self.algorithm).strip().lower()
        self.compression = compression_of(self.compression)
        if not isinstance(self.settings, dict):
            raise ConfigError(f"commlib backend Options: settings must be a dict of commlib.init settings, "
                              f"not {type(self.settings).__name__}")


def compression_of(value) -> Any:
    """``value`` as a compression commlib's allreduce takes (None stays None: "from the environment")."""
    if value is None or isinstance(value, (WireCodec, NoCompression, Compressor)):
        return value
    if isinstance(value, str) and value.strip().lower() in WIRE_COMPRESSIONS:
        return getattr(Compression, value.strip().lower())
    raise ConfigError(f"commlib backend Options: compression must be one of {', '.join(WIRE_COMPRESSIONS)}, a "
                      f"commlib.Compression member or a commlib compressor, not {value!r}")
