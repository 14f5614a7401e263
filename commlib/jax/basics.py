"""Start, stop and topology: commlib's own functions (one runtime serves every framework)."""

from ..api import (add_process_set, cross_rank, cross_size, global_process_set, init, is_initialized,
                   local_rank, local_size, rank, remove_process_set, shutdown, size)

__all__ = ["add_process_set", "cross_rank", "cross_size", "global_process_set", "init", "is_initialized",
           "local_rank", "local_size", "rank", "remove_process_set", "shutdown", "size"]
