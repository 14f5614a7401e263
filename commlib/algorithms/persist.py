"""What ``auto`` settled, kept between jobs: one file per layout in the user's cache directory, so that a
later job of the same layout starts settled (docs/algorithms.md, "What auto keeps between jobs").

A *layout* is what the measured times depend on and a job knows before it runs (:func:`.select.layout_of`):
the ranks and their nodes, the links between them as the cost model sees them (cross-memory attach on a
node, the summation servers, the model's parameters: a tuning profile's or the defaults), the settings
the algorithms read, the algorithms that can run, and :data:`FORMAT` with commlib's version. Its digest
names the file, ``<directory>/<digest>.json``, which holds the layout itself (a file holding another
layout is foreign) and the kept buckets (:meth:`.learn.Bucket.to_kept`), one per size class: settled, or
explored paced up to where a job ended (a later job goes on from there).

Reading never fails a job: a missing file starts afresh; a file that cannot be read, is not JSON, is of
another format or version, holds another layout, or holds a bucket that is not one is ignored with a log
line naming it and why. Writing is safe against other jobs writing the same layout at once: under an
exclusive lock of ``<file>.lock``, the file is read again, this job's buckets are merged into it (this
job's win for a size class both hold, except that a class this job still explored does not replace one
another job settled; the others' stay), and the result is written to a temporary file
in the same directory and renamed over it, so that a reader sees the old file or the new one, never part
of one. Only rank 0 reads and writes; the caller broadcasts what it read, so every rank starts from the
same buckets (:func:`.select.recall`).
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import functools
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Mapping

from .learn import Bucket

log = logging.getLogger("commlib")

#: The version of the kept files and of the learner's rules they were measured under: a file of another
#: format is ignored (raise it when what a bucket holds, or what its times mean, changes).
FORMAT = 3

SEEN, NEW, IGNORED, OFF = "seen", "new", "ignored", "off"


def user_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/commlib``, XDG_CACHE_HOME defaulting to ``~/.cache``."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "commlib"


def directory_of(setting: str | None) -> Path | None:
    """Where the kept files live for ``Config.auto_cache``: that directory, none for ``none``, else
    ``user_cache_dir()/auto``."""
    if setting is None:
        return user_cache_dir() / "auto"
    if setting.strip().lower() == "none":
        return None
    return Path(setting).expanduser()


@functools.lru_cache(maxsize=1)
def commlib_version() -> str:
    """The installed commlib's version (a kept file of another version is ignored)."""
    from importlib import metadata

    try:
        return metadata.version("commlib")
    except metadata.PackageNotFoundError:
        return "unknown"


def versioned(layout: Mapping) -> dict:
    """``layout`` with this module's format and commlib's version in it: what the file's name digests."""
    return {**layout, "format": FORMAT, "commlib": commlib_version()}


def digest(layout: Mapping) -> str:
    return hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest()[:24]


@dataclasses.dataclass
class Kept:
    """What a job found for its layout: where (``path``), whether it had run before (``status``: seen,
    new, ignored - a file was there and could not be used, ``reason`` says why - or off), and the settled
    buckets' data (:meth:`.learn.Bucket.to_kept`)."""

    status: str
    path: str = ""
    reason: str = ""
    buckets: list = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        """One line for ``--explain`` and the timeline: which it did."""
        if self.status == SEEN:
            settled = sum(b["settled"] is not None for b in self.buckets)
            going = (f", {len(self.buckets) - settled} go on exploring where it stopped"
                     if settled < len(self.buckets) else "")
            return (f"auto: this layout ran before: {settled} size class(es) start settled from {self.path} "
                    f"and are re-checked as they run{going}")
        if self.status == NEW:
            return f"auto: a new layout (nothing kept at {self.path}): each size class is explored"
        if self.status == IGNORED:
            return f"auto: {self.path} was ignored ({self.reason}): each size class is explored"
        return "auto: nothing is kept between jobs (COMMLIB_AUTO_CACHE=none): each size class is explored"

    def to_bytes(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Kept":
        return cls(**json.loads(data))


def path_of(directory: Path, layout: Mapping) -> Path:
    return Path(directory) / f"{digest(versioned(layout))}.json"


def read(directory: Path | None, layout: Mapping) -> Kept:
    """What earlier jobs kept for ``layout`` in ``directory`` (None: keeping is off). Never raises: a file
    that cannot be used is logged and ignored."""
    if directory is None:
        return Kept(OFF)
    path = path_of(directory, layout)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Kept(NEW, str(path))
    except OSError as exc:
        return _ignored(path, f"it cannot be read: {exc}")
    reason, buckets = _check(text, versioned(layout))
    if reason:
        return _ignored(path, reason)
    return Kept(SEEN, str(path), buckets=buckets)


def _ignored(path: Path, reason: str) -> Kept:
    log.warning("commlib: ignoring what auto kept in %s: %s; this job explores afresh and replaces it", path,
                reason)
    return Kept(IGNORED, str(path), reason)


def _check(text: str, layout: Mapping) -> tuple[str, list]:
    """('', the buckets' data) for a usable file's ``text``, else (why not, [])."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        return f"it is not JSON ({exc})", []
    if not isinstance(data, dict) or "layout" not in data or not isinstance(data.get("buckets"), list):
        return "it is not a file of what auto settled", []
    if data.get("format") != FORMAT or data["layout"].get("commlib") != layout["commlib"]:
        return (f"it is of format {data.get('format')} and commlib {data['layout'].get('commlib')}, not "
                f"{FORMAT} and {layout['commlib']}"), []
    if data["layout"] != json.loads(json.dumps(layout)):
        return "it holds another layout", []
    for bucket in data["buckets"]:
        try:
            Bucket.from_kept(bucket)
        except ValueError as exc:
            return str(exc), []
    return "", data["buckets"]


def write(directory: Path, layout: Mapping, buckets: list) -> Path:
    """Merge ``buckets`` (:meth:`.learn.Bucket.to_kept` data) into the file of ``layout``: under the
    layout's lock, over what the file holds (other jobs' size classes stay; this job's replace theirs),
    written whole and renamed into place. Raises OSError where the directory cannot be written."""
    layout = versioned(layout)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{digest(layout)}.json"
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            merged = {_key(b): b for b in _current(path, layout)}
            for bucket in buckets:
                older = merged.get(_key(bucket))
                if bucket["settled"] is not None or older is None or older["settled"] is None:
                    merged[_key(bucket)] = bucket  # (a class still exploring never replaces a settled one)
            document = {"format": FORMAT, "layout": layout,
                        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                        "buckets": sorted(merged.values(), key=lambda b: json.dumps(b["key"]))}
            handle, temporary = tempfile.mkstemp(dir=directory, prefix=path.stem, suffix=".tmp")
            try:
                with os.fdopen(handle, "w") as out:
                    json.dump(document, out, indent=1)
                os.replace(temporary, path)
            except BaseException:
                os.unlink(temporary)
                raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return path


def _current(path: Path, layout: Mapping) -> list:
    """The buckets ``path`` holds for ``layout`` now ([] where there is no usable file)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    return _check(text, layout)[1]


def _key(bucket: Mapping) -> str:
    return json.dumps(bucket["key"])
