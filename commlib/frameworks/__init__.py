"""What every framework plug-in shares (commlib.torch, commlib.tensorflow, commlib.keras).

A plug-in is a thin adapter: tensors in and out of its framework, gradient registration and the
framework's idioms. The rules that must read the same in every framework live here once: how ``op`` and
the deprecated ``average`` flag resolve, the ``process_set=`` plumbing, Horovod-style compressors around a
collective, ``gradient_predivide_factor``, how gradients form Horovod's ``groups``, and
which layers keep local gradients.
"""

from .common import (Adasum, Average, Max, Min, Product, Sum, check_predivide, compress, decompress, excluded,
                     horovod_style, local_layer_variables, predivide_factors, resolve_op, set_kwargs, set_rank,
                     set_size, split_evenly, wire)
