"""``load_model``: a saved Keras model back as it was compiled, its optimizer distributed.

Keras restores everything ``model.compile`` was given (optimizer with its state, loss, metrics); the
loaded optimizer itself then becomes the :func:`~commlib.keras.DistributedOptimizer` wrapper, so its
moments and ``iterations`` carry on. (Horovod maps optimizer names to wrapping constructors through
``custom_objects``; Keras 3 resolves its built-in optimizers before looking there, so that cannot work
for it.)
"""

from __future__ import annotations

from ..compression import Compression
from .optimizer import distribute
from .wrapper import GradientOptions, is_distributed


def load_model(keras, filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none):
    """``keras.models.load_model(filepath)`` (``keras`` the module of the Keras that saved it) with the
    optimizer wrapped in place; ``custom_optimizers`` (classes) join ``custom_objects`` by class name."""
    objects = {cls.__name__: cls for cls in custom_optimizers or []}
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not is_distributed(optimizer):
        distribute(optimizer, GradientOptions(compression=compression), in_place=True)
    return model
