"""``horovod.tensorflow.util``'s helpers that scripts and Horovod's tests import."""

from __future__ import annotations

from .bridge import executing_eagerly as _executing_eagerly  # noqa: F401  (Horovod's name)


def vars_to_refs(variables):
    """Hashable references of ``variables`` (a list, or nested lists, of variables)."""
    if isinstance(variables, list):
        return tuple(vars_to_refs(v) for v in variables)
    return variables.ref()


def refs_to_vars(refs):
    """The variables behind :func:`vars_to_refs`' references."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()
