"""Task 1's report (task_1_hf_baseline.py prints it once it has generated): what ran, the
figures of the one request, and the insight lines chosen from them. Printing only."""
from __future__ import annotations

from common import engine, fmt, report, settings

SHOWN_CHARS = 120    # of the generated text, in the report


def shown_text(text: str) -> str:
    """The generated text as the report shows it: its first SHOWN_CHARS characters."""
    return repr(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")


def print_report(gen: engine.Generation, model, dtype, max_tokens: int) -> None:
    report.section("WHAT RAN")
    report.run_info(model, dtype, gen.threads,
                    Sampling=f"do_sample=True, temperature={settings.TEMPERATURE}, "
                             f"seed={settings.SEED}, {max_tokens} new tokens (EOS held off)")
    report.section("RESULTS")
    report.note(f"Generated text: {shown_text(gen.text)}")
    report.row("Prompt tokens", gen.prompt_tokens)
    report.row("Generated tokens", gen.generated_tokens)
    report.row("Model load time (s)", fmt.secs(gen.load_time_s))
    report.row("Total time (s)", engine.time_text(gen.total_time_s, gen.pass_times_s))
    report.row("Tokens per second (tok/s)", f"{gen.tokens_per_s:.1f}")
    report.insight(insights(gen))


def insights(gen: engine.Generation) -> list[str]:
    """Two claims: what this figure is, and what it means for users who queue; the second from
    the measured time of the one request (twenty of them one after another, no batching)."""
    each = gen.total_time_s
    return [
        f"This is the speed of a single request: transformers' generate() made "
        f"{gen.generated_tokens} tokens at {gen.tokens_per_s:.1f} tok/s, one request at a "
        "time and with no batching.",
        f"Under load, requests queue: twenty users sent one after another would wait about "
        f"{20 * each:.0f} s for the last answer, at {fmt.secs(each)} s each.",
    ]
