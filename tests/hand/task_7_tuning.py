"""Task 7's record by hand (tests/hand/__init__.py): configs A, B and C, 10 requests of 50 tokens
each, 3 passes. Its tests: tests/tasks/test_tasks_6_7.py."""
from __future__ import annotations

import task_7_tuning as task7
from common import results, settings
from common.load import LoadLevel
from common.measure import Spread

HEADER = results.RunHeader("SmolLM2-135M-Instruct", dtype="float32")
# the summary's row of record(): A 70.0-75.0 and B 71.0-78.0 tok/s overlap; C 57.0-62.0 lies
# below B's lowest
SUMMARY_ROW = "A 72.0 / B 74.0 / C 60.0 tok/s; A, B not told apart; C below B"


def record(header: results.RunHeader | None = None) -> task7.Tuning:
    """A, B and C: 10 requests each, the median of 3 passes; C capped at 8 running, 2 waited."""
    runs = []
    for config, tok_s, (low, high), latency_s, running, waiting in zip(
            task7.CONFIGS, (72.0, 74.0, 60.0), ((70.0, 75.0), (71.0, 78.0), (57.0, 62.0)),
            (6.9, 6.7, 8.3), (10, 10, 8), (0, 0, 2)):
        level = LoadLevel(10, 10, 500 / tok_s, 500, tok_s, mean_latency_s=latency_s,
                          p50_latency_s=latency_s, p95_latency_s=latency_s * 1.1)
        runs.append(task7.ConfigRun(config, "restarted", 22.0, level, 30.0, 22, 16,
                                    running, waiting, 12, Spread(tok_s, low, high, 3), 1.4))
    return task7.Tuning(header=header or HEADER, num_requests=10, max_tokens=50,
                        kv_cache_memory_bytes=settings.KV_CACHE_BYTES, configs=runs)
