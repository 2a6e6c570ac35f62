"""What task 5 saves (results/task_5_api_server.json): the server it used and how it got it,
the request sent raw and through the openai client, each one's median pass and spread; and its
row in the summary's table."""
from __future__ import annotations

from dataclasses import dataclass

from common import measure, results
from common.load import HttpCall


@dataclass
class ApiSettings(results.Record):
    """What was asked for (max_tokens: the OpenAI API's name), and the server's settings
    (None for a --base-url server: the lab does not know them)."""
    prompt: str
    max_tokens: int
    temperature: float
    server: str | None = None


@dataclass
class ApiServer(results.Result):
    base_url: str
    server_state: str              # started, reused or external
    settings: ApiSettings
    raw_http: HttpCall
    openai_client: HttpCall
    startup_s: float | None = None   # None: not started here (reused, or --base-url)
    first_request: HttpCall | None = None      # the server's first request here, timed apart
    raw_latency: measure.Spread | None = None  # seconds, every timed pass; raw_http: the median
    sdk_latency: measure.Spread | None = None  # the same for openai_client


def summary_row(res: ApiServer) -> str:
    if res.raw_latency is None or res.raw_latency.num_passes < 2:
        return f"/v1/completions, {res.raw_http.latency_s:.2f} s"
    return (f"/v1/completions, {res.raw_latency.median:.2f} s ({res.raw_latency.low:.2f}-"
            f"{res.raw_latency.high:.2f})")
