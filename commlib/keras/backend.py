"""The collective for a Keras backend: each backend's plug-in reduces its own tensors (tf-keras' are
TensorFlow's).

``tensorflow`` -> :mod:`commlib.tensorflow` (works inside the ``tf.function`` Keras compiles), ``torch`` ->
:mod:`commlib.torch`, ``jax`` -> ``commlib.jax.overlapped_allreduce`` (inside the ``jax.jit`` Keras compiles
the train step into). Variables and metrics are moved as numpy arrays through commlib's own API, the same
on every backend.
"""

from __future__ import annotations

import importlib

import numpy as np

import commlib as _cl

from ..frameworks import set_kwargs

_PLUGINS = {"tensorflow": "commlib.tensorflow", "torch": "commlib.torch", "jax": "commlib.jax"}


def backend_name() -> str:
    import keras

    return keras.backend.backend()


def plugin(backend: str | None = None):
    """The plug-in module of ``backend`` (Keras' backend when None); a clear error when there is none or it
    cannot be imported."""
    backend = backend or backend_name()
    module = _PLUGINS.get(backend)
    if module is None:
        raise NotImplementedError(f"commlib.keras supports the tensorflow, torch and jax backends, not {backend!r}; "
                                  "set KERAS_BACKEND to one of them")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"Keras runs on the {backend} backend, whose commlib plug-in {module} cannot be "
                          f"imported ({exc}); install it or set KERAS_BACKEND to tensorflow or torch") from exc


def grouped_allreduce(tensors, op=_cl.Average, compression=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=None, name=None, backend: str | None = None):
    """Reduce ``backend``'s tensors (Keras' backend when None) over the ranks in one grouped collective."""
    tensors = list(tensors)
    if not tensors:
        return tensors
    backend = backend or backend_name()
    module = plugin(backend)
    kwargs = dict(op=op, name=name, **set_kwargs(process_set))
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        kwargs.update(prescale_factor=prescale_factor, postscale_factor=postscale_factor)
    if compression is not None:
        kwargs["compression"] = compression
    if backend == "jax":  # inside the jitted train step: each gradient's allreduce starts as XLA
        # computes it, overlapping the rest of the backward pass (commlib.jax.overlapped_allreduce)
        kwargs["name"] = name or "keras.DistributedOptimizer"
        return module.overlapped_allreduce(tensors, **kwargs)
    return module.grouped_allreduce(tensors, **kwargs)


def to_numpy(value) -> np.ndarray:
    """A variable's or tensor's value as a numpy array, on any backend."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    return array if array.flags.c_contiguous else array.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)


def broadcast_values(values, root_rank: int, name: str, process_set=None) -> list[np.ndarray]:
    """``root_rank``'s numpy arrays on every rank (one broadcast each, waited together)."""
    kwargs = set_kwargs(process_set)
    handles = [_cl.broadcast_async_(v, root_rank, name=f"{name}.{i}", **kwargs) for i, v in enumerate(values)]
    return [_cl.synchronize(h) for h in handles]
