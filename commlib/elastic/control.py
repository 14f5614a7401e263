"""What the workers and commlib-run's elastic driver share: one directory (``COMMLIB_ELASTIC_DIR``, set by
the driver for every rank) holding

- ``state.pkl``: the last committed state, written by rank 0 at each ``commit()`` (written to a temporary
  file and renamed, so a worker killed mid-write leaves the previous commit intact);
- ``hosts_updated``: present while the driver has changed hosts the running job has not yet taken up.

A worker that must be restarted (a collective failed, or the hosts changed) exits with
:data:`RESTART_EXIT_CODE`; the driver then starts the job again on the hosts it has, from ``state.pkl``.
The directory must be visible to the first host of every launch (a shared filesystem on a real cluster;
one machine on the emulated cluster).
"""

from __future__ import annotations

import os

RESTART_EXIT_CODE = 79  # "restart me from the last commit": the driver does, without blacklisting a host
SNAPSHOT = "state.pkl"
HOSTS_UPDATED = "hosts_updated"


def directory() -> str | None:
    """The driver's directory, or None outside the elastic driver (the runtime's settings)."""
    from .. import lifecycle

    return lifecycle.config().elastic_dir


def write_snapshot(path: str, data: bytes) -> None:
    target = os.path.join(path, SNAPSHOT)
    temporary = f"{target}.{os.getpid()}.tmp"
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, target)


def read_snapshot(path: str) -> bytes | None:
    try:
        with open(os.path.join(path, SNAPSHOT), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def hosts_updated(path: str) -> bool:
    return os.path.exists(os.path.join(path, HOSTS_UPDATED))


def flag_hosts_updated(path: str, text: str) -> None:
    """The driver's side: tell the running job (at its next commit) that the hosts changed."""
    with open(os.path.join(path, HOSTS_UPDATED), "w") as f:
        f.write(text + "\n")


def clear_hosts_updated(path: str) -> None:
    try:
        os.remove(os.path.join(path, HOSTS_UPDATED))
    except FileNotFoundError:
        pass
