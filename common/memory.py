"""Peak memory of a lab step, every process it runs included: the script, its children, and the
lab's vLLM server (API server, engine core holding the worker, resource tracker), also when an
earlier task started it.

Memory is PSS (proportional set size; psutil's memory_full_info().pss, which Linux reports in
/proc/<pid>/smaps_rollup): a page shared by two processes (torch's libraries in the API server
and the engine core) counts half in each, so the sum over the processes is what they take
together, which is what a 4 GB VM has to hold. RSS would count shared pages twice. The process
tree comes from psutil too (Process.children(recursive=True)).

Reading PSS is not free: the kernel walks every page of the process to split the shared ones.
Read four times a second from every process of a step, it slowed the work it measured
(docs/measurements.md, "What the memory sampler cost"). So the
sampler reads each process's RSS every interval, which costs next to nothing, and its PSS only
where the peak can have moved (PeakMemory).
"""
from __future__ import annotations

import ctypes
import gc
import os
import time

import psutil

from common import server
from common.poller import Poller

SAMPLE_INTERVAL_S = 0.25
# PeakMemory reads PSS where the processes' RSS rose by this much above its last reading (about
# the 0.01 GB the reports print), and at least this often:
RSS_STEP_BYTES = 8 * 2**20
PSS_EVERY_S = 5.0


def pss_bytes(pid: int) -> int:
    """PSS of one process (0 when it is gone or a zombie); its RSS where its PSS is not readable
    (another user's process: smaps_rollup is private, the RSS is not)."""
    try:
        process = psutil.Process(pid)
        try:
            return process.memory_full_info().pss
        except psutil.AccessDenied:
            return process.memory_info().rss
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return 0


def rss_bytes(pid: int) -> int:
    """RSS of one process (0 when it is gone): a line of /proc/<pid>/statm, no page walk."""
    try:
        return psutil.Process(pid).memory_info().rss
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return 0


def step_pids(root: int, groups: set[int]) -> set[int]:
    """root and its descendants, plus every process in one of the given process groups."""
    pids = {root}
    try:
        pids.update(child.pid for child in psutil.Process(root).children(recursive=True))
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        pass   # root is gone: nothing of its tree is left to count
    if groups:   # psutil has no process group: ask the OS for each process's
        for pid in psutil.pids():
            try:
                if os.getpgid(pid) in groups:
                    pids.add(pid)
            except ProcessLookupError:   # ended since psutil listed it
                continue
    return pids


def tree_memory(root_pid: int, groups: set[int]) -> tuple[int, int]:
    """(PSS in bytes, processes holding memory) of step_pids(root_pid, groups)."""
    sizes = [pss_bytes(pid) for pid in step_pids(root_pid, groups)]
    return sum(sizes), sum(1 for size in sizes if size)


def server_memory(pid: int) -> tuple[int, int]:
    """(PSS in bytes, processes holding memory) of a server the lab started: its API process
    (pid, which leads the process group), the engine core and every other process it started."""
    return tree_memory(pid, {pid})


class PeakMemory(Poller):
    """Samples the memory of a step (its process tree + the lab server on server_port, which an
    earlier step may have started) in the background: its peak PSS, and how many processes
    held memory then.

    Every interval it lists the processes and reads their RSS; it reads their PSS (the costly
    part: module docstring) only when the RSS total rose by RSS_STEP_BYTES above what it was at
    the last reading, or PSS_EVERY_S has passed. A page mapped moves PSS and RSS up together, so
    a new peak shows in the RSS first, save in three cases that the floor of PSS_EVERY_S catches,
    late by at most that long (a rise of these kinds that lasts less can be missed): pages stop
    being shared (a sharer unmaps them or exits) while the RSS stands still; a page shared since
    a fork is written to (copy-on-write; vLLM on a CPU spawns its processes rather than fork
    them); the RSS falls, then rises again to less than the level last read, with fewer of its
    pages shared. A fall alone reads nothing: an engine freed and made again each pass (task 13)
    costs no reading. While a step holds its memory steady that is one reading in 5 s.
    """

    def __init__(self, root_pid: int, server_port: int | None = None,
                 interval_s: float = SAMPLE_INTERVAL_S):
        super().__init__(interval_s)
        self.root_pid = root_pid
        self.server_port = server_port
        self.peak_bytes = 0
        self.peak_processes = 0
        self.num_samples = 0            # RSS readings
        self.num_pss_readings = 0
        self._last_reading: tuple[int, float] | None = None    # the RSS total then, when

    def poll(self) -> None:
        # the API server leads its process group (started in a session of its own)
        group = server.lab_server_pid(self.server_port) if self.server_port else None
        pids = step_pids(self.root_pid, {group} - {None})
        rss, now = sum(rss_bytes(pid) for pid in pids), time.monotonic()
        self.num_samples += 1
        last = self._last_reading
        if last is not None and rss < last[0] + RSS_STEP_BYTES and now - last[1] < PSS_EVERY_S:
            return
        sizes = [pss_bytes(pid) for pid in pids]
        self._last_reading = (rss, now)
        self.num_pss_readings += 1
        if sum(sizes) > self.peak_bytes:
            self.peak_bytes, self.peak_processes = sum(sizes), sum(1 for size in sizes if size)


def give_memory_back() -> None:
    """Collect, then hand the freed heap back to the OS (glibc's malloc_trim): the many
    mid-sized buffers of a model and of its packed weights, once freed, otherwise stay
    with the process, most of a GB of it, beside the vLLM processes a task starts next (tasks 12
    and 13) and counted in the step's peak. Elsewhere than glibc: nothing."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def child_env(unset: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment of a child of ours that runs vLLM or mini_engine: this one's, less the
    variables it must not inherit, with vLLM's log held to its errors."""
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["VLLM_LOGGING_LEVEL"] = "ERROR"
    return env
