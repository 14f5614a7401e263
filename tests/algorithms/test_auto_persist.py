"""What auto settled, kept between jobs (commlib/algorithms/persist.py): the kept state round-trips, a file it
cannot use is ignored with a log line, concurrent jobs writing one layout leave a whole file holding every
job's classes, and another layout starts afresh; in real jobs, a later job of the same layout starts settled
on every rank alike and says so, and a changed layout explores (tests/algorithms/workers/auto_persist.py)."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os

import pytest

from commlib.algorithms import learn, persist, select
from commlib.algorithms.learn import SETTLED, Bucket, Learner
from mpirun import run_mpi

LAYOUT = {"shape": {"node_of_rank": [0, 0], "cma": True}, "algorithms": ["native", "ring"], "model": {"a": 1}}
OTHER = {**LAYOUT, "shape": {"node_of_rank": [0, 1], "cma": False}}


def settled(power: int, winner: str = "ring") -> dict:
    """A settled bucket's data for size class ``power``, as Bucket.to_kept writes it."""
    bucket = Bucket((power, None, False), ["ring", "native"], {"ring": 1e-4, "native": 2e-4}, reps=2, rounds=1,
                    agreed={"ring": [1e-4 if winner == "ring" else 3e-4], "native": [2e-4]})
    bucket.settle_on(winner)
    return bucket.to_kept()


def test_kept_buckets_round_trip(tmp_path):
    kept = [settled(12), settled(20, "native")]
    path = persist.write(tmp_path, LAYOUT, kept)
    found = persist.read(tmp_path, LAYOUT)
    assert found.status == persist.SEEN and found.path == str(path)
    assert sorted(json.dumps(b) for b in found.buckets) == sorted(json.dumps(b) for b in kept)
    learner = Learner(lambda v: v)
    for data in persist.Kept.from_bytes(found.to_bytes()).buckets:  # what rank 0 broadcasts
        learner.restore(Bucket.from_kept(data))
    assert {key: (b.state, b.settled) for key, b in learner.buckets.items()} == {
        (12, None, False): (SETTLED, "ring"), (20, None, False): (SETTLED, "native")}
    assert "ran before" in found.describe() and "2 size class(es)" in found.describe()


def test_a_later_write_merges_and_replaces_a_class(tmp_path):
    persist.write(tmp_path, LAYOUT, [settled(12), settled(16)])
    persist.write(tmp_path, LAYOUT, [settled(16, "native"), settled(24)])
    found = {b["key"][0]: b["settled"] for b in persist.read(tmp_path, LAYOUT).buckets}
    assert found == {12: "ring", 16: "native", 24: "ring"}


def exploring(power: int) -> dict:
    """A class of 5 ms calls explored paced up to one agreed block, as Bucket.to_kept writes it."""
    return dict(settled(power), settled=None, agreed={"ring": [5e-3]}, dropped=[],
                predicted_s={"ring": 5e-3, "native": 1e-2})


def test_a_class_still_exploring_never_replaces_one_settled(tmp_path):
    persist.write(tmp_path, LAYOUT, [settled(12), exploring(16)])
    persist.write(tmp_path, LAYOUT, [exploring(12), exploring(16), exploring(20)])  # a later, shorter job
    found = {b["key"][0]: b["settled"] for b in persist.read(tmp_path, LAYOUT).buckets}
    assert found == {12: "ring", 16: None, 20: None}
    persist.write(tmp_path, LAYOUT, [settled(20, "native")])
    kept = persist.read(tmp_path, LAYOUT)
    assert {b["key"][0]: b["settled"] for b in kept.buckets} == {12: "ring", 16: None, 20: "native"}
    assert "2 size class(es) start settled" in kept.describe() and "1 go on exploring" in kept.describe()
    learner = Learner(lambda v: v, pace=0.05)
    for data in kept.buckets:
        learner.restore(Bucket.from_kept(data))
    going = learner.buckets[(16, None, False)]
    assert going.state is learn.MEASURING and going.leader == "ring" and going.slots[0] == "ring"


def test_another_layout_starts_afresh(tmp_path):
    persist.write(tmp_path, LAYOUT, [settled(12)])
    found = persist.read(tmp_path, OTHER)
    assert found.status == persist.NEW and found.buckets == [] and "new layout" in found.describe()
    assert persist.path_of(tmp_path, LAYOUT) != persist.path_of(tmp_path, OTHER)
    assert persist.read(tmp_path, LAYOUT).status == persist.SEEN  # the first layout's file is untouched


def test_nothing_is_read_or_kept_when_off():
    assert persist.directory_of("none") is None and persist.directory_of("NONE ") is None
    assert persist.read(None, LAYOUT).status == persist.OFF


def test_the_default_directory_is_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert persist.directory_of(None) == tmp_path / "commlib" / "auto"
    assert persist.directory_of("~/elsewhere") == persist.Path("~/elsewhere").expanduser()


def corrupt(path, text):
    path.write_text(text)


def foreign(path, text):
    data = json.loads(text)
    data["layout"]["shape"]["node_of_rank"] = [0, 0, 0]
    path.write_text(json.dumps(data))


def other_format(path, text):
    path.write_text(json.dumps(dict(json.loads(text), format=persist.FORMAT + 1)))


def other_version(path, text):
    data = json.loads(text)
    data["layout"]["commlib"] = "0.0.1"
    path.write_text(json.dumps(data))


def bad_bucket(path, text):
    data = json.loads(text)
    data["buckets"][0]["settled"] = "torus2d"  # not among its candidates
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("spoil,why", [
    (lambda p, t: corrupt(p, t[: len(t) // 2]), "not JSON"), (lambda p, t: corrupt(p, "[1, 2]"), "not a file"),
    (foreign, "another layout"), (other_format, "of format"), (other_version, "commlib 0.0.1"),
    (bad_bucket, "not among its candidates")],
    ids=["truncated", "not-kept-state", "foreign", "other-format", "other-version", "bad-bucket"])
def test_a_file_it_cannot_use_is_ignored_with_a_log_line(tmp_path, caplog, spoil, why):
    path = persist.write(tmp_path, LAYOUT, [settled(12)])
    spoil(path, path.read_text())
    with caplog.at_level(logging.WARNING, logger="commlib"):
        found = persist.read(tmp_path, LAYOUT)
    assert found.status == persist.IGNORED and found.buckets == [] and why in found.reason, found
    assert str(path) in caplog.text and why in caplog.text
    persist.write(tmp_path, LAYOUT, [settled(16)])  # the next job's write replaces it
    assert [b["key"][0] for b in persist.read(tmp_path, LAYOUT).buckets] == [16]


def write_many(directory: str, job: int, writes: int) -> None:
    for i in range(writes):
        persist.write(directory, LAYOUT, [settled(8 + job), settled(40 + (job * writes + i) % 7, "native")])


def read_many(directory: str, reads: int, out) -> None:
    statuses = set()
    for _ in range(reads):
        statuses.add(persist.read(directory, LAYOUT).status)
    out.put(sorted(statuses))


def test_concurrent_jobs_writing_one_layout_leave_a_whole_file(tmp_path):
    context = multiprocessing.get_context("fork")
    statuses = context.Queue()
    reader = context.Process(target=read_many, args=(str(tmp_path), 300, statuses))
    writers = [context.Process(target=write_many, args=(str(tmp_path), job, 25)) for job in range(4)]
    reader.start()
    for writer in writers:
        writer.start()
    for process in writers + [reader]:
        process.join(timeout=120)
        assert process.exitcode == 0
    assert set(statuses.get(timeout=10)) <= {persist.NEW, persist.SEEN}  # never a part of a file
    found = persist.read(tmp_path, LAYOUT)
    assert found.status == persist.SEEN
    assert {b["key"][0] for b in found.buckets} == {8, 9, 10, 11} | {40 + i for i in range(7)}
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


class Context:
    """What select.keep reads of a lane's context."""

    def __init__(self, directory, learner):
        self.rank, self.learner = 0, learner
        self.config = type("Config", (), {"auto_cache": str(directory)})()
        self.kept = persist.Kept(persist.NEW, str(directory))


def test_a_directory_that_cannot_be_written_is_logged_not_raised(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(select, "layout_of", lambda ctx: LAYOUT)
    learner = Learner(lambda v: v)
    learner.restore(Bucket.from_kept(settled(12)))
    blocked = tmp_path / "file"
    blocked.write_text("")
    with caplog.at_level(logging.WARNING, logger="commlib"):
        select.keep(Context(blocked / "auto", learner))  # a directory under a file
    assert "could not keep" in caplog.text
    select.keep(Context(tmp_path / "auto", learner))
    assert persist.read(tmp_path / "auto", LAYOUT).status == persist.SEEN


def test_classes_exploring_at_once_are_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(select, "layout_of", lambda ctx: LAYOUT)
    learner = Learner(lambda v: v)
    learner.restore(Bucket.from_kept(settled(12)))
    exploring = learner.bucket((20, None, False), lambda: [select.Choice("ring", 1 << 20, 1e-3),
                                                          select.Choice("native", 1 << 20, 1.1e-3)])
    assert exploring.state not in learn.KEPT
    select.keep(Context(tmp_path, learner))
    assert [b["key"][0] for b in persist.read(tmp_path, LAYOUT).buckets] == [12]


@pytest.mark.mpi
def test_a_later_job_of_the_layout_starts_settled_and_a_changed_layout_explores(tmp_path):
    env = {"COMMLIB_AUTO_CACHE": str(tmp_path), "COMMLIB_TIMELINE": str(tmp_path / "trace.json")}
    run_mpi(2, "auto_persist.py", "new", env=env, timeout=120)
    assert len([p for p in tmp_path.glob("*.json") if not p.name.startswith("trace")]) == 1
    run_mpi(2, "auto_persist.py", "seen", env=env, timeout=120)
    with open(tmp_path / "trace.json") as timeline:
        assert "this layout ran before" in timeline.read()
    run_mpi(2, "auto_persist.py", "new", env={**env, "COMMLIB_LOCAL_SIZE": "1"}, timeout=120)  # 2 nodes
    kept = [p for p in tmp_path.glob("*.json") if not p.name.startswith("trace")]
    assert len(kept) == 2 and all(os.path.getsize(p) for p in kept)
