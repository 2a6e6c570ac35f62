"""Task 1's record by hand (tests/hand/__init__.py): 50 tokens in 3.33 s, 15.0 tok/s. The
lab-wide tests draw the report page and the summary's roofline from it."""
from __future__ import annotations

from common import results
from lessons.task_1 import record as task1
from tests import hand

HEADER = results.RunHeader("SmolLM2-135M-Instruct", dtype="float32")
SUMMARY_ROW = "15.0 tok/s"          # the summary's row of record()


def record(header: results.RunHeader | None = None) -> task1.HFBaseline:
    r = hand.fill(task1.HFBaseline, tokens_per_s=15.0, total_time_s=50 / 15, generated_tokens=50)
    r.header = header or HEADER
    return r
