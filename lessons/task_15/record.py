"""What task 15 saves (results/task_15_serve_your_engine.json): for each of the three servers,
how it started, task 5's call, task 6's levels (each level's median pass and its spread), the
largest level's requests as a timeline, and its own engine offline on the same requests; and
the summary's row."""
from __future__ import annotations

from dataclasses import dataclass, field

from common import load, measure, results


@dataclass
class Timeline(results.Record):
    """One level's requests: when each was sent and when each streamed chunk came, in seconds
    from the level's first send (what the figure draws)."""
    sent_s: list[float]
    chunk_s: list[list[float]]

    @classmethod
    def of(cls, level: load.LoadLevel) -> "Timeline | None":
        ok = [r for r in level.requests if r.success]
        if not ok:
            return None
        t0 = min(r.start_s for r in level.requests)
        return cls([round(r.start_s - t0, 4) for r in ok],
                   [[round(r.start_s - t0 + t, 4) for t in r.token_times_s] for r in ok])


@dataclass
class Offline(results.Record):
    """The server's own engine with no server in front, one user count, a value a pass (all the
    requests at once, EOS held off, as the server's level): tokens/s; the time to make one token
    of each (the prompts' prefill); and the step that makes each later token (the rest of the
    time over the tokens after the first)."""
    num_users: int
    tokens_per_s: measure.Spread
    first_token_s: measure.Spread
    step_s: measure.Spread


@dataclass
class ServerRun(results.Record):
    """One server under the lab's load. skipped: why it did not run (one line), else None."""
    way: str                                   # "vLLM", "mini_engine" or "transformers"
    command: str                               # how it was started
    skipped: str | None = None
    startup_s: float | None = None             # until /health answered
    first_request_s: float | None = None       # its first request, timed apart (a warm-up)
    sdk_call: load.HttpCall | None = None      # task 5's call, the OpenAI SDK's
    levels: list[load.LoadLevel] = field(default_factory=list)   # each level's median pass
    spreads: list[measure.Spread] = field(default_factory=list)  # tok/s of each level's passes
    timeline: Timeline | None = None           # the largest level's median pass
    offline: list[Offline] = field(default_factory=list)
    offline_startup_s: float | None = None
    offline_error: str | None = None           # why the offline run failed, else None

    def level(self, num_users: int) -> load.LoadLevel | None:
        return next((lv for lv in self.levels if lv.num_users == num_users), None)

    def spread(self, num_users: int) -> measure.Spread | None:
        return next((s for lv, s in zip(self.levels, self.spreads)
                     if lv.num_users == num_users), None)

    def offline_run(self, num_users: int) -> Offline | None:
        return next((o for o in self.offline if o.num_users == num_users), None)

    def offline_at(self, num_users: int) -> measure.Spread | None:
        """Offline tokens/s at this many users (None: not run)."""
        run = self.offline_run(num_users)
        return run.tokens_per_s if run else None

    def door(self, num_users: int) -> float | None:
        """The front door's cost: the server's tokens/s over its engine's offline, on the same
        requests (None: either is missing)."""
        served, alone = self.level(num_users), self.offline_at(num_users)
        # a level with a failed request is no price of the door: its tokens are missing
        if served is None or alone is None or not alone.median or served.num_failed:
            return None
        return served.tokens_per_s / alone.median

    def door_range(self, num_users: int) -> tuple[float, float] | None:
        """The door's lowest and highest, from the two spreads (server low over offline high,
        and the other way)."""
        served, alone = self.spread(num_users), self.offline_at(num_users)
        if served is None or alone is None or not alone.low or self.door(num_users) is None:
            return None
        return served.low / alone.high, served.high / alone.low


@dataclass
class ThreeServers(results.Result):
    engine_settings: str               # vLLM's and mini_engine's
    users: list[int]
    max_tokens: int
    temperature: float
    num_passes: int
    servers: list[ServerRun]

    def server(self, way: str) -> ServerRun | None:
        return next((s for s in self.servers if s.way == way and not s.skipped), None)

    @property
    def largest(self) -> int:
        return max(self.users)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summary_row(res: ThreeServers) -> str:
    """'20 users: mini_engine 561, vLLM 380, transformers 160 tok/s; server/offline 0.92, 0.80,
    1.01'."""
    n, ran = res.largest, [s for s in res.servers if not s.skipped and s.level(res.largest)]
    if not ran:
        return "no server ran"
    tps = ", ".join(f"{s.way} {s.level(n).tokens_per_s:.0f}" for s in ran)
    doors = [s.door(n) for s in ran]
    door = (f"; server/offline {', '.join('-' if d is None else f'{d:.2f}' for d in doors)}"
            if any(d is not None for d in doors) else "")
    return f"{n} users: {tps} tok/s{door}"
