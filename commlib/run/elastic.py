"""commlib-run's elastic driver: keep a job training while hosts come and go.

With MPICH (hydra) the job runs with ``-disable-auto-cleanup``, so the survivors of a lost rank keep
running; they report to the driver, which decides who goes on (:mod:`.survivors`), and they rebuild
commlib over themselves in process (:mod:`commlib.elastic.recover`). Growth, too few survivors, and any
loss under Open MPI restart the job, as torchrun does, with Horovod Elastic's state and flags on the
workers' side (:mod:`commlib.elastic`):

1. Discover the hosts: ``--host-discovery-script`` prints ``host`` or ``host:slots`` lines (without it:
   ``-H``/``--hostfile``, or the emulated cluster's hosts); leave out blacklisted hosts.
2. Wait until they have ``--min-np`` slots (at most ``--elastic-timeout`` seconds, then fail naming what
   was found), and start ``min(slots, --max-np)`` ranks with ``COMMLIB_ELASTIC_DIR`` set.
3. While the job runs, discover again every second; a change is flagged in that directory, and the
   workers' next ``commit()`` raises ``HostsUpdatedInterrupt`` on every rank, which ends the job with
   the restart code. With in-process recovery, read the workers' reports of a failed collective every
   50 ms, decide the survivors, blacklist the lost ranks' hosts.
4. When the job ends: 0 is done (after a recovery: every survivor wrote status 0). The restart code
   (hosts changed, a collective failed, too few survivors) restarts it. Any other failure blacklists the
   host hydra names as where a process died (``RUNNING AT host``), for a cool-down drawn from
   ``--blacklist-cooldown-range`` (without it: for good), and restarts it. Every restart counts against
   ``--reset-limit``.

The restarted workers resume from the state rank 0 committed last (``state.pkl`` in the directory).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable, Mapping, Sequence

from ..config import FIELDS, environment, for_job, is_set
from ..elastic import control
from . import output, survivors
from .hosts import Host
from .options import UsageError

_DIED_AT = re.compile(r"RUNNING AT (\S+)")


@dataclasses.dataclass
class ElasticOptions:
    min_np: int
    max_np: int | None
    discovery_script: str | None
    slots_per_host: int | None
    elastic_timeout: float
    reset_limit: int | None
    cooldown: tuple[float, float] | None
    interval: float = 1.0


def options(args) -> ElasticOptions | None:
    """The elastic options of ``args``, or None for a fixed-size job."""
    if args.min_np is None and args.max_np is None and args.host_discovery_script is None:
        for flag, value in (("--reset-limit", args.reset_limit), ("--elastic-timeout", args.elastic_timeout),
                            ("--blacklist-cooldown-range", args.blacklist_cooldown_range),
                            ("--slots-per-host", args.slots_per_host)):
            if value is not None:
                raise UsageError(f"{flag} applies to elastic jobs: give --min-np (and --max-np or "
                                 "--host-discovery-script)")
        return None
    min_np = int(args.min_np if args.min_np is not None else (args.np or 1))
    max_np = int(args.max_np) if args.max_np is not None else None
    if min_np < 1 or (max_np is not None and max_np < min_np):
        raise UsageError(f"--min-np {min_np} and --max-np {max_np}: need 1 <= min-np <= max-np")
    cooldown = None
    if args.blacklist_cooldown_range is not None:
        try:
            low, high = (float(x) for x in args.blacklist_cooldown_range)
        except ValueError:
            raise UsageError("--blacklist-cooldown-range takes two numbers of seconds, e.g. 10 100") from None
        if not 0 <= low <= high:
            raise UsageError(f"--blacklist-cooldown-range {low:g} {high:g}: need 0 <= low <= high")
        cooldown = (low, high)
    return ElasticOptions(min_np=min_np, max_np=max_np, discovery_script=args.host_discovery_script,
                          slots_per_host=int(args.slots_per_host) if args.slots_per_host else None,
                          elastic_timeout=float(args.elastic_timeout) if args.elastic_timeout is not None else 600.0,
                          reset_limit=int(args.reset_limit) if args.reset_limit is not None else None,
                          cooldown=cooldown)


def parse_discovered(text: str, slots_per_host: int | None) -> list[Host]:
    """``host`` or ``host:slots`` per line (blank lines and ``#`` comments skipped)."""
    hosts = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([^:\s]+)(?::(\d+))?", line)
        if not match:
            raise UsageError(f"host discovery printed {line!r}; each line must be host or host:slots")
        slots = int(match.group(2)) if match.group(2) else (slots_per_host or 1)
        if slots > 0:
            hosts.append(Host(match.group(1), slots))
    return hosts


class Blacklist:
    """Hosts left out after a failure, each until its cool-down ends (for good without a range)."""

    def __init__(self, cooldown: tuple[float, float] | None, rng: random.Random | None = None):
        self._cooldown = cooldown
        self._until: dict[str, float] = {}
        self._rng = rng or random.Random()

    def add(self, host: str, now: float) -> float:
        until = float("inf") if self._cooldown is None else now + self._rng.uniform(*self._cooldown)
        self._until[host] = until
        return until

    def allows(self, host: str, now: float) -> bool:
        return self._until.get(host, 0.0) <= now

    def listed(self, now: float) -> list[str]:
        return sorted(h for h, t in self._until.items() if t > now)


def choose(hosts: Sequence[Host], max_np: int | None) -> tuple[list[Host], int]:
    """The hosts to start on, in discovery order, and the number of ranks: all their slots up to max_np."""
    chosen, np = [], 0
    for host in hosts:
        if max_np is not None and np >= max_np:
            break
        take = host.slots if max_np is None else min(host.slots, max_np - np)
        chosen.append(Host(host.name, take))
        np += take
    return chosen, np


@dataclasses.dataclass
class Launcher:
    """How the driver starts a job on ``hosts`` with ``np`` ranks: (mpiexec's environment, argv); how it
    takes one down; and the environment the discovery script runs with."""

    command: Callable[[list[Host], int, dict], tuple[dict, list[str]]]
    kill: Callable[[subprocess.Popen], None]
    static_hosts: list[Host]
    discovery_env: dict = dataclasses.field(default_factory=dict)
    check_hosts: Callable[[list[Host]], None] | None = None
    in_process: bool = False  # hydra: survivors of a lost rank go on (-disable-auto-cleanup), see survivors.py
    #: True when every worker of the running launch has ended and none finished its work (a launcher that
    #: can tell, as Ray's actors can): then nothing is left to report to the driver, and mpiexec may wait
    #: for ever on a lost host's connection (commlib.run.relay keeps it open)
    workers_gone: Callable[[], bool] | None = None
    #: the world ranks of the running launch whose worker has ended (a launcher that can tell), so that the
    #: driver need not wait for their reports (commlib.run.survivors.decide)
    ranks_gone: Callable[[], set[int]] | None = None
    #: host name -> the address its hydra proxy connects to mpiexec from, for the hosts given (a launcher
    #: whose proxies run under commlib.run.relay with the elastic directory, which marks each proxy that
    #: ended: the ranks of its host are gone too)
    proxy_addresses: Callable[[Sequence[str]], Mapping[str, str]] | None = None


#: the timeout (COMMLIB_TIMEOUT) of an elastic job that sets none: how long a lost rank takes to be noticed
ELASTIC_TIMEOUT_S = 10.0
#: how often the driver asks the launcher whether every worker is gone, and how long mpiexec then has to
#: end by itself before the driver ends it
GONE_CHECK_S = 1.0
GONE_GRACE_S = 5.0
#: after the first report of a failed collective, how long the driver collects near-simultaneous ones
#: before leaving out the suspected ranks that have not reported (a suspect leaves either way)
SETTLE_S = 0.25
#: how long after its timeout a live rank may take to fail its wait and report (the deadline's grace for a
#: peer's notice, docs/failures.md)
PEER_GRACE_S = 1.0


class Driver:
    def __init__(self, opts: ElasticOptions, launcher: Launcher, settings: dict[str, str],
                 out=None, clock=time.monotonic):
        self.opts = opts
        self.launcher = launcher
        self.settings = dict(settings)
        self.blacklist = Blacklist(opts.cooldown)
        self.out = out or sys.stderr
        self.clock = clock
        self.resets = 0

    def say(self, text: str) -> None:
        print(f"commlib-run: elastic: {text}", file=self.out, flush=True)

    def discover(self) -> list[Host]:
        if not self.opts.discovery_script:
            return list(self.launcher.static_hosts)
        done = subprocess.run(self.opts.discovery_script, shell=True, capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, **self.launcher.discovery_env))
        if done.returncode != 0:
            raise UsageError(f"host discovery script {self.opts.discovery_script!r} failed with exit code "
                             f"{done.returncode}: {done.stderr.strip()[-300:]}")
        return parse_discovered(done.stdout, self.opts.slots_per_host)

    def usable(self) -> list[Host]:
        now = self.clock()
        return [h for h in self.discover() if self.blacklist.allows(h.name, now)]

    def wait_for_hosts(self) -> tuple[list[Host], int]:
        start = self.clock()
        said = False
        while True:
            hosts = self.usable()
            slots = sum(h.slots for h in hosts)
            if slots >= self.opts.min_np:
                return choose(hosts, self.opts.max_np)
            waited = self.clock() - start
            if waited >= self.opts.elastic_timeout:
                listed = ", ".join(f"{h.name}:{h.slots}" for h in hosts) or "none"
                raise UsageError(
                    f"only {slots} slot(s) available (hosts: {listed}; blacklisted: "
                    f"{', '.join(self.blacklist.listed(self.clock())) or 'none'}) after waiting "
                    f"{waited:.0f} s; --min-np {self.opts.min_np} not reached within --elastic-timeout "
                    f"{self.opts.elastic_timeout:g} s")
            if not said:
                self.say(f"waiting for --min-np {self.opts.min_np} slots (have {slots})")
                said = True
            time.sleep(self.opts.interval)

    def run(self) -> int:
        given = for_job(self.settings).elastic_dir  # the caller's directory, else one of the driver's own
        directory = given or tempfile.mkdtemp(prefix="commlib-elastic-")
        try:
            return self._loop(directory)
        finally:
            if not given:
                shutil.rmtree(directory, ignore_errors=True)

    def _loop(self, directory: str) -> int:
        settings = dict(self.settings, **environment(elastic_dir=directory))
        if not is_set("timeout_s", settings):
            settings.update(environment(timeout_s=ELASTIC_TIMEOUT_S))
        if self.launcher.in_process:
            settings.update(environment(elastic_in_process=True))
        self.peer_timeout = for_job(settings).timeout_s  # what every worker's init() reads
        self.say(f"a lost rank is noticed within {self.peer_timeout:g} s ({FIELDS['timeout_s'].env})")
        while True:
            hosts, np = self.wait_for_hosts()
            if self.launcher.check_hosts is not None:
                try:
                    self.launcher.check_hosts(hosts)
                except UsageError as exc:
                    self.say(f"{exc}; blacklisting those hosts")
                    now = self.clock()
                    for host in hosts:
                        if f"{host.name}:" in str(exc):
                            self.blacklist.add(host.name, now)
                    continue
            control.clear_hosts_updated(directory)
            survivors.clear(directory)
            env, argv = self.launcher.command(hosts, np, settings)
            if self.launcher.in_process:
                argv = [argv[0], "-disable-auto-cleanup", *argv[1:]]
            self.say(f"starting {np} rank(s) on {', '.join(f'{h.name}:{h.slots}' for h in hosts)}"
                     f" (restart {self.resets})")
            code, died_at = self._run_job(env, argv, hosts, directory)
            if code == 0:
                self.say("job finished")
                return 0
            self.resets += 1
            if code == control.RESTART_EXIT_CODE and died_at:  # survivors asked for it after a loss
                now = self.clock()
                for host in died_at:
                    self.blacklist.add(host, now)
                self.say(f"the survivors asked for a restart (lost hosts {', '.join(died_at)} blacklisted)")
            elif code == control.RESTART_EXIT_CODE:
                self.say("the workers asked for a restart (hosts changed, or a collective failed)")
            else:
                now = self.clock()
                for host in died_at:
                    until = self.blacklist.add(host, now)
                    self.say(f"a process died on {host}: blacklisted "
                             f"{'for good' if until == float('inf') else f'for {until - now:.0f} s'}")
                if not died_at:
                    self.say(f"the job failed with exit code {code} (no host named)")
            if self.opts.reset_limit is not None and self.resets > self.opts.reset_limit:
                self.say(f"--reset-limit {self.opts.reset_limit} reached; giving up")
                return code or 1

    def _run_job(self, env: dict, argv: list[str], hosts: list[Host], directory: str) -> tuple[int, list[str]]:
        """Run one launch to its end, echoing its output, flagging host changes; return (exit code, hosts
        hydra said a process died on)."""
        print(f"commlib-run: {' '.join(argv)}", file=self.out, flush=True)
        job = subprocess.Popen(argv, env=dict(os.environ, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
        tail: collections.deque = collections.deque(maxlen=400)  # hydra's report of a lost process is here
        relays = output.relays(job, tail)
        running = {h.name for h in hosts}
        flagged = False
        recovery = _Recovery(survivors.rank_hosts(hosts)) if self.launcher.in_process else None
        next_discovery = self.clock() + self.opts.interval
        next_gone_check = self.clock() + GONE_CHECK_S
        try:
            while job.poll() is None:
                time.sleep(0.05 if recovery is not None else self.opts.interval)
                if self.launcher.workers_gone is not None and self.clock() >= next_gone_check:
                    next_gone_check = self.clock() + GONE_CHECK_S
                    if self.launcher.workers_gone():
                        self._end_orphaned(job)
                        break
                if recovery is not None:
                    self._recover(recovery, directory)
                    if recovery.finished(directory):  # every survivor ended; mpiexec may wait on a cut host
                        try:
                            job.wait(timeout=5)
                        except subprocess.TimeoutExpired:
                            self.launcher.kill(job)
                        break
                    if recovery.restart:
                        break
                    lost = {recovery.hosts[r] for r in recovery.lost}
                    if lost & running:
                        running -= lost
                        hosts = [h for h in hosts if h.name in running]
                if self.clock() < next_discovery:
                    continue
                next_discovery = self.clock() + self.opts.interval
                if flagged or job.poll() is not None:
                    continue
                try:
                    now_usable = self.usable()
                except (UsageError, subprocess.TimeoutExpired) as exc:
                    self.say(f"host discovery failed while the job runs: {exc}")
                    continue
                names = {h.name for h in now_usable}
                _, could = choose(now_usable, self.opts.max_np)
                launched = sum(h.slots for h in hosts)
                if not running <= names or could > launched:
                    control.flag_hosts_updated(directory, ",".join(sorted(names)))
                    self.say(f"hosts changed ({', '.join(sorted(names))}); the workers stop at their next commit")
                    flagged = True
        except BaseException:
            self.launcher.kill(job)
            raise
        if recovery is not None and recovery.restart and job.poll() is None:
            try:
                job.wait(timeout=self.peer_timeout + 10)  # the survivors exit with the restart code
            except subprocess.TimeoutExpired:
                pass
            self.launcher.kill(job)
        for relay in relays:
            relay.join(timeout=10)
        code = job.returncode
        if code != 0:
            self.launcher.kill(job)  # what hydra left behind
        died = sorted(set(_DIED_AT.findall(b"".join(tail).decode(errors="replace"))))
        if recovery is not None and recovery.generation:
            lost_hosts = sorted({recovery.hosts[r] for r in recovery.lost})
            if recovery.restart:
                return control.RESTART_EXIT_CODE, lost_hosts
            codes = survivors.exit_codes(directory, recovery.members)
            if len(codes) == len(recovery.members):  # mpiexec's own status is the lost ranks'
                bad = {r: c for r, c in codes.items() if c != 0}
                if not bad:
                    return 0, lost_hosts
                code = max(bad.values())
                return code, lost_hosts if code == control.RESTART_EXIT_CODE else [recovery.hosts[r] for r in bad]
        return code, [h for h in died if h in running] or died

    def _end_orphaned(self, job: subprocess.Popen) -> None:
        """Every worker ended without finishing (each lost or crashed) while mpiexec still runs: let it end
        by itself for a moment, else end it, so that the launch fails (and the driver restarts or gives up)
        instead of waiting for reports that no process is left to write."""
        try:
            job.wait(timeout=GONE_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            pass
        self.say("every worker of this launch ended without finishing (lost or crashed) and mpiexec still "
                 "waits: ending the launch")
        self.launcher.kill(job)
        try:
            job.wait(timeout=GONE_GRACE_S)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()

    def _recover(self, recovery: "_Recovery", directory: str) -> None:
        """Decide on the survivors once the reports of the current generation allow it."""
        reports = survivors.read_reports(directory, recovery.generation)
        if not reports:
            return
        now = self.clock()
        if recovery.first_report is None:
            recovery.first_report = now
            self.say(f"rank(s) {sorted(reports)} report a failed collective; deciding who goes on")
        suspects = {r: rep.get("suspects", []) for r, rep in sorted(reports.items())}
        gone = self.launcher.ranks_gone() if self.launcher.ranks_gone is not None else set()
        gone |= self._behind_closed_proxies(recovery, directory)
        chosen = survivors.decide(recovery.members, suspects, now - recovery.first_report, SETTLE_S,
                                  2 * self.peer_timeout + 5.0, gone=gone,
                                  patience=self.peer_timeout + PEER_GRACE_S + SETTLE_S)
        if chosen is None:
            return
        self.say(f"reports (rank: the ranks it suspects): {suspects}")
        lost = sorted(set(recovery.members) - set(chosen))
        lost_hosts = sorted({recovery.hosts[r] for r in lost})
        for host in lost_hosts:
            until = self.blacklist.add(host, now)
            self.say(f"lost rank(s) on {host}: blacklisted "
                     f"{'for good' if until == float('inf') else f'for {until - now:.0f} s'}")
        if len(chosen) < self.opts.min_np:
            survivors.write_decision(directory, recovery.generation,
                                     {"restart": f"{len(chosen)} survivor(s), fewer than --min-np {self.opts.min_np}"})
            self.say(f"{len(chosen)} survivor(s) < --min-np {self.opts.min_np}: restarting the job")
            recovery.restart = True
        else:
            survivors.write_decision(directory, recovery.generation, {"members": chosen})
            self.say(f"{len(chosen)} rank(s) go on in process (world ranks {chosen}; lost {lost})")
        recovery.lost |= set(lost)
        recovery.members = chosen
        recovery.generation += 1
        recovery.first_report = None

    def _behind_closed_proxies(self, recovery: "_Recovery", directory: str) -> set[int]:
        """The members whose host's proxy ended (commlib.run.relay's marks), where the launcher can tell."""
        if self.launcher.proxy_addresses is None:
            return set()
        closed = survivors.closed_proxies(directory)
        if not closed:
            return set()
        if recovery.addresses is None:  # asked once a proxy has ended: nothing to ask in a healthy launch
            recovery.addresses = dict(self.launcher.proxy_addresses(sorted(set(recovery.hosts))))
        return {r for r in recovery.members if recovery.addresses.get(recovery.hosts[r]) in closed}


class _Recovery:
    """One launch's in-process recoveries: its current members (world ranks) and what was lost."""

    def __init__(self, hosts: list[str]):
        self.hosts = hosts
        self.addresses: dict[str, str] | None = None  # host -> its proxy's address (Launcher.proxy_addresses)
        self.members = list(range(len(hosts)))
        self.lost: set[int] = set()
        self.generation = 0
        self.first_report: float | None = None
        self.restart = False

    def finished(self, directory: str) -> bool:
        return bool(self.generation) and not self.restart and \
            len(survivors.exit_codes(directory, self.members)) == len(self.members)
