"""The exceptions commlib raises."""


class CommlibError(RuntimeError):
    """Base class of commlib's errors."""


class CollectiveError(CommlibError):
    """A collective failed: mismatched requests between ranks, a stall, a shutdown, or a failure in the
    background thread. Raised by ``synchronize`` and by the synchronous calls, on every rank involved."""


class ConfigError(CommlibError, ValueError):
    """A ``COMMLIB_*`` variable or an argument has an invalid value."""


class InFlightError(CommlibError, ValueError):
    """A tensor name was submitted again while its first submission is still in flight (a ValueError, as
    Horovod raises for it)."""


class ProcessSetError(CommlibError, ValueError):
    """A process set is used wrongly: not registered, removed, not including this rank, or added with
    different ranks on different ranks (a ValueError, as in Horovod)."""


class UnsupportedDtypeError(CommlibError, TypeError):
    """The array's element type cannot take part in the requested operation."""


class PeerLostError(CollectiveError):
    """A peer did not answer within the timeout (``COMMLIB_TIMEOUT``, or a stall shutdown): a cut link, a
    frozen or dead host. ``ranks`` are the world ranks this rank waited for (the unreachable ones where
    known), ``what`` says what it was doing. The runtime is unusable afterwards: every later call raises
    the same error at once; the process may exit (commlib then skips MPI's collective teardown, see
    docs/failures.md). Elastic training catches it to rebuild without ``ranks``."""

    def __init__(self, message: str, ranks=(), what: str = ""):
        super().__init__(message)
        self.ranks = tuple(int(r) for r in ranks)
        self.what = what
