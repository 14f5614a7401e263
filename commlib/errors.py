"""The exceptions commlib raises."""


class CommlibError(RuntimeError):
    """Base class of commlib's errors."""


class CollectiveError(CommlibError):
    """A collective failed: mismatched requests between ranks, a stall, a shutdown, or a failure in the
    background thread. Raised by ``synchronize`` and by the synchronous calls, on every rank involved."""


class ConfigError(CommlibError, ValueError):
    """A ``COMMLIB_*`` variable or an argument has an invalid value."""
