"""Task 15's record by hand (tests/hand/__init__.py): three servers at 1 and 20 users of 50
tokens each, and each engine offline. Worked out:
- vLLM: 350 tok/s served at 20 users against 400 offline: 0.875x; at 1 user 40 against 40;
- mini_engine: 600 against 625: 0.96x; 50 against 50;
- transformers: 240 against 240: 1.00x; 24 against 20: 1.20x, its offline first tokens 0.40 s
  against 0.22 s served at 20 users: its offline way is no price of its door.
Its tests: tests/tasks/test_task_15.py."""
from __future__ import annotations

from common import results, settings
from common.load import HttpCall
from common.measure import Spread
from lessons.task_15.record import Offline, ServerRun, ThreeServers, Timeline
from tests.helpers import level

HEADER = results.RunHeader("SmolLM2-135M-Instruct", dtype="float32")
SUMMARY_ROW = ("20 users: vLLM 350, mini_engine 600, transformers 240 tok/s; "
               "server/offline 0.88, 0.96, 1.00")


def spread(median: float, half: float) -> Spread:
    return Spread(median, median - half, median + half, 3)


def server(way: str, served: tuple, offline: tuple, itl: tuple | None) -> ServerRun:
    """served: (tok/s, TTFT s, TPOT s) at 1 and 20 users; offline: (tok/s, first token s, step
    s) at 1 and 20; itl: the server's own inter-token latency at 1 and 20 (None: no /metrics)."""
    levels = [level(n, tps, tpot, mean_ttft_s=ttft, engine_itl_s=itl[i] if itl else None)
              for i, (n, (tps, ttft, tpot)) in enumerate(zip((1, 20), served))]
    return ServerRun(
        way, f"{way} --port 8000", startup_s=5.0, first_request_s=1.5,
        sdk_call=HttpCall(" Inference is the step where a model answers.", 1.2, 9, 50),
        levels=levels, spreads=[spread(lv.tokens_per_s, 5.0) for lv in levels],
        timeline=Timeline([0.0, 0.01], [[0.10, 0.15, 0.20], [0.12, 0.17, 0.22]]),
        offline=[Offline(n, spread(tps, 5.0), spread(first, 0.0), spread(step, 0.0))
                 for n, (tps, first, step) in zip((1, 20), offline)],
        offline_startup_s=4.0)


def record(header: results.RunHeader | None = None) -> ThreeServers:
    return ThreeServers(
        "max_model_len=128, max_num_seqs=256", [1, 20], 50, settings.TEMPERATURE, 3, [
            server("vLLM", ((40.0, 0.03, 0.025), (350.0, 0.14, 0.055)),
                   ((40.0, 0.03, 0.025), (400.0, 0.10, 0.050)), (0.025, 0.054)),
            server("mini_engine", ((50.0, 0.03, 0.020), (600.0, 0.10, 0.033)),
                   ((50.0, 0.03, 0.020), (625.0, 0.08, 0.031)), (0.020, 0.033)),
            server("transformers", ((24.0, 0.07, 0.041), (240.0, 0.22, 0.080)),
                   ((20.0, 0.33, 0.042), (240.0, 0.40, 0.078)), None)],
        header=header or HEADER)
