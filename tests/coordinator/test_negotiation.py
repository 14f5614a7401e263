"""The ready table alone (no MPI): what every rank decides identically from the same rounds."""

from commlib.coordinator.negotiation import ReadyTable, describe_mismatch
from commlib.coordinator.requests import AUTO_NAME_MARK, Kind, Meta


def meta(name, shape=(4,), kind=Kind.ALLREDUCE):
    return Meta(name, kind, "float32", shape)


def decide(table, *metas_by_rank):
    for rank, m in enumerate(metas_by_rank):
        table.add_full(rank, m, 0.0)
    return table.take_ready()


def test_a_named_tensor_gets_a_cache_id_and_its_hits_decide_it():
    table = ReadyTable(2, cache_capacity=8)
    (response,) = decide(table, meta("w"), meta("w"))
    assert not response.error and table.cache_id(meta("w")) == 0
    table.add_cached(0, 1 << 0, 0.0)
    assert table.take_ready() == []          # rank 1 has not submitted it again yet
    table.add_cached(1, 1 << 0, 0.0)
    (again,) = table.take_ready()
    assert again.metas == [meta("w")]


def test_unnamed_tensors_and_barriers_take_no_cache_id():
    table = ReadyTable(2, cache_capacity=8)
    unnamed = meta(f"allreduce{AUTO_NAME_MARK}0")
    decide(table, unnamed, unnamed)
    barrier = meta("b", (), Kind.BARRIER)
    decide(table, barrier, barrier)
    assert table.cache_id(unnamed) == -1 and table.cache_id(barrier) == -1


def test_a_cache_id_keeps_its_metadata_when_the_name_is_renegotiated():
    table = ReadyTable(2, cache_capacity=8)
    decide(table, meta("w"), meta("w"))
    (response,) = decide(table, meta("w", (5,)), meta("w", (5,)))
    assert not response.error and response.metas[0].shape == (5,)
    assert table.cache_id(meta("w", (5,))) == -1 and table.cache_id(meta("w")) == 0


def test_a_full_request_against_cached_hits_is_compared_in_full():
    table = ReadyTable(2, cache_capacity=8)
    decide(table, meta("w"), meta("w"))
    table.add_cached(0, 1, 0.0)                 # rank 0: same as before
    table.add_full(1, meta("w", (5,)), 0.0)      # rank 1: a new shape
    (response,) = table.take_ready()
    assert "mismatched shape (rank 0: (4,), rank 1: (5,))" in response.error


def test_allgather_may_differ_in_the_first_dimension_only():
    gather = {0: meta("g", (2, 3), Kind.ALLGATHER), 1: meta("g", (5, 3), Kind.ALLGATHER)}
    assert describe_mismatch("g", gather) == ""
    gather[1] = meta("g", (5, 4), Kind.ALLGATHER)
    assert "mismatched shape (rank 0: (3,), rank 1: (4,))" in describe_mismatch("g", gather)
