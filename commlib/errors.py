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
