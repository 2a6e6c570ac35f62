"""What task 1 saves: transformers' one generation (results/task_1_hf_baseline.json; task 2
reads it back as its baseline), and its row in the summary's table."""
from __future__ import annotations

from dataclasses import dataclass

from common import engine


@dataclass
class HFBaseline(engine.OneRequest):
    """Task 1's result: transformers' one generation (common.engine.OneRequest's fields; task 2
    reads it back as its baseline)."""


def summary_row(res: HFBaseline) -> str:
    return res.tokens_per_s_text()
