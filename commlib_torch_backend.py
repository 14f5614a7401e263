"""torch's ``torch.backends`` entry point for commlib (named in setup.py): ``import torch`` calls
:func:`autoload`, which registers the ``"commlib"`` torch.distributed backend, so that
``init_process_group("commlib")`` works in a script that never imports commlib.

A module outside the ``commlib`` package on purpose: torch imports an entry point's module before calling
it and refuses to import at all if that fails, and importing anything under ``commlib`` imports commlib
and its dependencies (numpy, mpi4py, the MPI library). Here a commlib that cannot be imported costs only
the backend's name, with a warning that says why, never ``import torch``."""

from __future__ import annotations

import warnings


def autoload() -> None:
    """Register the ``"commlib"`` backend; warn (and leave torch usable) where commlib cannot load."""
    try:
        from commlib.torch.distributed.registration import register

        register()
    except Exception as exc:  # noqa: BLE001 - any error here would make `import torch` fail
        warnings.warn(f"commlib could not register its torch.distributed backend: {exc!r}; "
                      "init_process_group('commlib') will not know the name ('import commlib.torch' shows the "
                      "error; TORCH_DEVICE_BACKEND_AUTOLOAD=0 stops torch loading backends at import)",
                      RuntimeWarning, stacklevel=2)
