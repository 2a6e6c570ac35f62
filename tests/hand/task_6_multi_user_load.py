"""Task 6's record by hand (tests/hand/__init__.py): 1, 5, 10 and 20 users of 50 tokens each,
and the 20 one after another. Its tests: tests/tasks/test_tasks_6_7.py."""
from __future__ import annotations

from common import results, settings
from common.load import LoadLevel
from lessons.task_6 import record as task6

HEADER = results.RunHeader("SmolLM2-135M-Instruct", dtype="float32")
SUMMARY_ROW = "20 users 80.0 tok/s (4.2x)"   # the summary's row of record(): 1,000 / 12.5 s


def hand_level(num_users: int, duration_s: float) -> LoadLevel:
    """num_users requests of 50 tokens in duration_s; latencies from it (p95: the whole level)."""
    return LoadLevel(num_users, num_users, duration_s, 50 * num_users,
                     round(50 * num_users / duration_s, 2), mean_latency_s=duration_s * 0.9,
                     p50_latency_s=duration_s * 0.9, p95_latency_s=duration_s,
                     mean_ttft_s=0.1 * num_users, mean_tpot_s=duration_s / 50)


def record(header: results.RunHeader | None = None) -> task6.MultiUserLoad:
    """1, 5, 10 and 20 users; the 20 one after another took 76 s."""
    users = [1, 5, 10, 20]
    return task6.MultiUserLoad(
        header=header or HEADER, base_url="http://127.0.0.1:8000", server_state="reused",
        users_per_level=users, max_tokens=50, temperature=settings.TEMPERATURE,
        levels=[hand_level(u, d) for u, d in zip(users, (3.8, 7.0, 9.0, 12.5))],
        scaling_factor=4.2, server_config="max_model_len=128, max_num_seqs=256",
        sequential=LoadLevel(20, 20, 76.0, 1000, 1000 / 76.0, is_concurrent=False))
