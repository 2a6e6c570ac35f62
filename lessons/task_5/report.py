"""Task 5's report (task_5_api_server.py prints it once the two clients have taken turns): which
server answered, each client's median response, and the insight lines chosen from the passes.
Printing only."""
from __future__ import annotations

from common import measure, report, settings
from common.load import HttpCall


def print_server(srv, model, dtype, prompt: str) -> None:
    """Which server answers (started, reused or external), with what, for which prompt."""
    report.row("Server URL", srv.base_url)
    shown = prompt if len(prompt) <= 80 else prompt[:77] + "..."
    report.row("Prompt", f'"{shown}"')
    if srv.state == "external":
        report.row("Model", srv.model_name)
        report.row("Server", "external (--base-url): not started or stopped by the lab")
    else:
        report.run_info(model, dtype, settings.num_cores(), Engine=srv.config.describe())
        report.row("Server", f"{srv.state} (PID {srv.pid}), log: {srv.log_path}")
        if srv.startup_s is not None:
            report.row("Ready after (s)", f"{srv.startup_s:.1f}")


def print_responses(srv, raw: HttpCall, raw_s: measure.Spread, sdk: HttpCall,
                    sdk_s: measure.Spread) -> None:
    """Each client's median pass: its text, latency with the spread, and token usage."""
    for name, r, spread in (("RESPONSE: raw HTTP (requests)", raw, raw_s),
                            ("RESPONSE: official openai client, only base_url changed", sdk,
                             sdk_s)):
        report.section(name)
        report.note(f"Response (its median pass): {r.text.strip()!r}")
        report.row("Latency (s)", spread.text(digits=2))
        report.row("Prompt tokens", r.prompt_tokens)
        report.row("Completion tokens", r.completion_tokens)
    report.section("API DETAILS")
    report.row("Format", "OpenAI-compatible (drop-in replacement)")
    report.row("Auth", "no API key needed (local server)")
    if srv.state != "external":
        report.row("Server left running", "for tasks 6-8; stop it with `make stop`")


def first_request_note(first_s: float, later: measure.Spread) -> str:
    """The first request against the passes after it: only slower than all of them is it a
    warm-up cost (a server's first request pays for what its start left to do)."""
    if first_s > later.high:
        return (f"The first request took {first_s:.2f} s, longer than every later pass "
                f"({later.low:.2f}-{later.high:.2f} s): a warm-up the later figures leave out.")
    return (f"The first request took {first_s:.2f} s, within or under the later passes "
            f"({later.low:.2f}-{later.high:.2f} s): this server was already warm.")


def clients_line(raw: measure.Spread, sdk: measure.Spread) -> str:
    """Plain HTTP against the SDK: two ways, told apart only where their passes do not overlap
    (measure.Spread.overlaps); one whole sentence a case."""
    if raw.num_passes < 2 or sdk.num_passes < 2:
        return (f"The same JSON took {raw.median:.2f} s over plain HTTP and {sdk.median:.2f} s "
                "through the SDK, one pass each: not told apart from the machine's drift.")
    if raw.overlaps(sdk):
        return (f"The same JSON took {raw.median:.2f} s over plain HTTP and {sdk.median:.2f} s "
                f"through the SDK (medians of {raw.num_passes} passes, in turns), within each "
                "other's passes: the SDK adds nothing measurable.")
    return (f"The same JSON took {raw.median:.2f} s over plain HTTP and {sdk.median:.2f} s "
            f"through the SDK (medians of {raw.num_passes} passes, in turns), apart by more "
            f"than their passes: the SDK took {sdk.median / raw.median:.2f}x plain HTTP's time.")


def insights(raw_s: measure.Spread, sdk_s: measure.Spread) -> list[str]:
    return ["Any app that uses the OpenAI SDK works with vLLM: the client above changed only "
            "its base_url.",
            clients_line(raw_s, sdk_s)]
