"""The elastic driver's side of in-process recovery (commlib.elastic.recover has the workers' side):
read the workers' reports of a failed collective, decide who goes on, and write the decision.

Every rank whose collective failed writes ``report.<generation>.<world rank>`` naming the ranks it
suspects; a killed rank writes nothing. :func:`decide` turns the reports into the survivors:

- a member that did not report is gone once every member not suspected by anyone has reported (a rank
  waiting behind the lost one fails its own wait within the timeout and reports) and ``settle`` seconds
  have passed since the first report (to gather reports made at nearly the same moment); a suspected
  member is not waited for (a killed one never reports), so it stays only if it reported by then;
- a suspicion is explained, and ignored, when the suspected reporter was itself waiting behind a fault
  (:func:`_behind`: a member that is gone, i.e. did not report, or two reporters that suspect each
  other; directly, or behind another reporter that was), and does not suspect its suspecter back: with
  no notices between the workers (commlib.coordinator.lifecycle), in a chain rank 0 runs out of time
  waiting for rank 1, which waits for the killed rank 2 (and so reports first); rank 1 is healthy and
  stays. A cycle of one-way suspicions (a ring waiting on a cut-off host) explains nothing. An explanation
  that rests on a missing member waits for it up to ``patience`` seconds unless it is known gone: before a
  late report arrives, a cut-off rank 2 waiting for rank 0 (reports {1: [2], 2: [0]}) reads as the chain;
- a reporter that another reporter suspects (unexplained) leaves too, the one suspected by the most
  leaving first (ties: the higher rank) until no remaining reporter suspects another: a host whose link
  went down suspects everyone and everyone suspects it, so it leaves and the connected side stays. This
  errs on the safe side: a slow but healthy rank may be left out (two survivors that each name the other,
  as ranks waiting in MPI's own collective name every rank, lose one of them); a communicator built with
  an unreachable rank would hang in its creation;
- past ``limit`` seconds the reporters so far are the survivors, whatever is missing.
"""

from __future__ import annotations

import json
import os
from typing import AbstractSet, Mapping, Sequence


def read_reports(directory: str, generation: int) -> dict[int, dict]:
    """World rank -> report, for the reports of ``generation`` written so far."""
    prefix = f"report.{generation}."
    reports = {}
    for name in os.listdir(directory):
        if name.startswith(prefix) and not name.endswith(".tmp"):
            try:
                with open(os.path.join(directory, name)) as f:
                    reports[int(name[len(prefix):])] = json.load(f)
            except (OSError, ValueError):  # renamed into place whole: a partial read is impossible
                continue
    return reports


def decide(members: Sequence[int], reports: Mapping[int, Sequence[int]], waited: float, settle: float,
           limit: float, gone: AbstractSet[int] = frozenset(), patience: float = 0.0) -> list[int] | None:
    """The survivors (sorted world ranks), or None to wait for more reports. ``reports``: reporter ->
    the ranks it suspects; ``waited``: seconds since the first report; ``gone``: members known to have
    ended (a launcher that can tell: Ray's actors, or a Slurm node's proxy that commlib.run.relay saw end).

    A missing member that a suspicion's explanation rests on (a reporter waited behind it) may only be late:
    a chain 0 -> 1 -> 2 with 2 silent reads the same as a cut-off 1 -> 2 -> 0 before 0's report arrives. Such
    a member counts as gone once known gone, or after ``patience`` seconds (a live member fails its own
    wait within the timeout and its grace, and reports)."""
    members = set(members)
    reporters = set(reports) & members
    suspected = {r for suspects in reports.values() for r in suspects} & members
    missing = members - reporters
    if missing and waited < limit:
        if missing - suspected:  # a member nobody suspects has not reported yet
            return None
        if waited < settle:
            return None
    chosen = _vote(reports, reporters, _behind(reports, reporters, missing))
    if waited < min(patience, limit) and chosen != _vote(reports, reporters,
                                                         _behind(reports, reporters, missing & set(gone))):
        return None  # the verdict rests on a member that may still report
    return chosen


def _vote(reports: Mapping[int, Sequence[int]], reporters: set[int], behind: set[int]) -> list[int]:
    """The reporters left once the most suspected leave in turn (suspicions of ``behind`` explained)."""
    standing = {s: {r for r in reports[s] if not (r in behind and s not in reports[r])} for s in reporters}
    alive = set(reporters)
    while True:
        votes = {r: sum(1 for s in alive if s != r and r in standing[s]) for r in alive}
        worst = max(alive, key=lambda r: (votes[r], r), default=None)
        if worst is None or votes[worst] == 0:
            return sorted(alive)
        alive.discard(worst)


def _behind(reports: Mapping[int, Sequence[int]], reporters: set[int], gone: set[int]) -> set[int]:
    """The reporters that waited behind a fault: each suspects a gone member, or is one of two reporters
    that suspect each other (a broken link between them, or one of them cut off), or suspects a reporter
    behind one that does not suspect it back (a chain: 0 waits for 1, which waits for 2, which waits for
    the killed 3). A suspicion of such a reporter is explained, unless the two suspect each other."""
    behind = {r for r in reporters
              if any(s in gone or (s in reporters and r in reports[s]) for s in reports[r])}
    while True:
        more = {r for r in reporters - behind if any(s in behind and r not in reports[s] for s in reports[r])}
        if not more:
            return behind
        behind |= more


def write_decision(directory: str, generation: int, decision: dict) -> None:
    target = os.path.join(directory, f"members.{generation}")
    temporary = f"{target}.tmp"
    with open(temporary, "w") as f:
        json.dump(decision, f)
    os.replace(temporary, target)


def exit_codes(directory: str, ranks: Sequence[int]) -> dict[int, int]:
    """The exit status each of ``ranks`` wrote when it ended after a recovery (those that wrote one)."""
    codes = {}
    for rank in ranks:
        try:
            with open(os.path.join(directory, f"exit.{rank}")) as f:
                codes[rank] = int(json.load(f)["code"])
        except (OSError, ValueError, KeyError):
            continue
    return codes


#: the prefix of :func:`mark_proxy_closed`'s files
_CLOSED = "proxy-closed"


def mark_proxy_closed(directory: str, address: str) -> None:
    """Record that the hydra proxy that connected from ``address`` closed its connection to mpiexec: it
    ended, and with it every rank it was the parent of (commlib.run.relay calls this)."""
    try:
        open(os.path.join(directory, f"{_CLOSED}.{address}"), "w").close()
    except OSError:  # the directory is gone: the launch is over
        pass


def closed_proxies(directory: str) -> set[str]:
    """The addresses of the proxies marked by :func:`mark_proxy_closed` since the launch began."""
    prefix = f"{_CLOSED}."
    return {name[len(prefix):] for name in os.listdir(directory) if name.startswith(prefix)}


def clear(directory: str) -> None:
    """Remove the previous launch's recovery files (a new launch numbers its ranks afresh)."""
    for name in os.listdir(directory):
        if name.split(".", 1)[0] in ("report", "members", "exit", _CLOSED):
            try:
                os.remove(os.path.join(directory, name))
            except FileNotFoundError:
                pass


def rank_hosts(hosts) -> list[str]:
    """The host of each world rank of a launch on ``hosts`` (hydra fills each host's slots in order)."""
    return [h.name for h in hosts for _ in range(h.slots)]
