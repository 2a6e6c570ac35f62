"""Task 5: vLLM OpenAI-Compatible API Server.

Starts (or reuses) the lab's vLLM server on :8000 with the lab's settings, waits until /health
answers (and says how long that took), then sends "What is inference in machine learning?" to
/v1/completions: as raw HTTP with `requests`, and with the official `openai` client where only
base_url changes. The server's first request is timed apart (it is slower, and says nothing
about the two clients); then the two take turns, --passes times each after one untimed round.
Prints the text, latency and token usage of each one's median pass, with the spread. The
server stays up for tasks 6-8; `make stop` stops it.

    python task_5_api_server.py [--model M] [--dtype auto] [--prompt TEXT] [--port 8000]
        [--passes 3]
    python task_5_api_server.py --base-url http://gpu-box:8000   # any OpenAI-compatible server
"""
from __future__ import annotations

import time

import requests

from common import cli, figures, load, measure, report, results, settings
from common.load import HttpCall, completion_payload, refusal
from lessons.task_5 import FIGURES
from lessons.task_5.record import ApiServer, ApiSettings
from lessons.task_5.report import first_request_note, insights, print_responses, print_server

SCRIPT = "task_5_api_server"
PROMPT = "What is inference in machine learning?"


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    cli.add_model_args(parser)
    cli.add_server_args(parser)
    cli.add_sampling_args(parser, prompt=PROMPT)
    parser.add_argument("--passes", type=cli.positive_int, default=measure.PASSES,
                        help=f"timed passes of each client, taking turns (default "
                             f"{measure.PASSES})")
    return parser.parse_args(argv)


def send_raw(base_url: str, model: str, prompt: str, max_tokens: int) -> HttpCall:
    """POST /v1/completions as plain JSON over HTTP."""
    start = time.perf_counter()
    resp = requests.post(f"{base_url}/v1/completions",
                         json=completion_payload(model, prompt, max_tokens, stream=False), timeout=300)
    latency = time.perf_counter() - start
    if resp.status_code != 200:
        cli.fail(f"the server refused the request: {refusal(resp.status_code, resp.text)}", code=1)
    body = resp.json()
    return HttpCall(body["choices"][0]["text"], latency, body["usage"]["prompt_tokens"],
                    body["usage"]["completion_tokens"])


def send_openai(base_url: str, model: str, prompt: str, max_tokens: int) -> HttpCall:
    """The same request with the official OpenAI SDK: only base_url differs from OpenAI's API.
    (min_tokens is vLLM's extension to hold EOS off; the SDK passes it through extra_body.)"""
    try:
        return load.send_openai(base_url, model, prompt, max_tokens)
    except load.CallFailed as e:
        cli.fail(str(e), code=1)


def median_call(calls: list[HttpCall]) -> tuple[HttpCall, measure.Spread]:
    """The median pass by latency, kept whole (its text and tokens), and every pass's spread."""
    latencies = [c.latency_s for c in calls]
    return calls[measure.median_index(latencies)], measure.Spread.of(latencies)


def main(argv: list[str] | None = None) -> ApiServer:
    args = parse_args(argv)
    report.title("Task 5: vLLM OpenAI-Compatible API Server")
    srv, model, dtype = cli.lab_server(args.base_url, args.model, args.dtype, host=args.host,
                                       port=args.port)
    print_server(srv, model, dtype, args.prompt)

    report.section("SENDING REQUEST")
    report.row("Endpoint", f"{srv.base_url}/v1/completions")
    first = send_raw(srv.base_url, srv.model_name, args.prompt, args.max_tokens)
    report.row("First request (s)", f"{first.latency_s:.2f} (raw HTTP, timed apart)")
    ways = {"raw": lambda: send_raw(srv.base_url, srv.model_name, args.prompt, args.max_tokens),
            "sdk": lambda: send_openai(srv.base_url, srv.model_name, args.prompt,
                                       args.max_tokens)}
    passes = measure.in_turns(ways, args.passes)
    (raw, raw_s), (sdk, sdk_s) = (median_call(passes[way]) for way in ways)
    report.note(first_request_note(first.latency_s, raw_s))
    print_responses(srv, raw, raw_s, sdk, sdk_s)
    report.insight(insights(raw_s, sdk_s))
    asked = ApiSettings(args.prompt, args.max_tokens, settings.TEMPERATURE,
                        srv.config.describe() if srv.config else None)
    record = ApiServer(srv.base_url, srv.state, asked, raw, sdk,
                       round(srv.startup_s, 2) if srv.startup_s is not None else None,
                       first, raw_s, sdk_s,
                       header=results.RunHeader.of(model, dtype, settings.num_cores(),
                                                   srv.model_name))
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    return record


if __name__ == "__main__":
    cli.run(main)
