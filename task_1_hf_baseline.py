"""Task 1: Naive HuggingFace Inference - the baseline.

Loads the lab's model with transformers and generates 50 new tokens for one prompt with
model.generate() (do_sample=True, temperature=0.7), after one untimed warm-up. Prints the text,
the generated tokens, the total time and tokens per second, and saves them for task 2.

    python task_1_hf_baseline.py [--model M] [--dtype auto|bfloat16|float32] [--prompt TEXT]
"""
from __future__ import annotations

from common import cli, engine, figures, report, results, settings
from lessons.task_1 import FIGURES
from lessons.task_1.record import HFBaseline

SCRIPT = "task_1_hf_baseline"


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    cli.add_model_args(parser)
    cli.add_sampling_args(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> HFBaseline:
    args = parse_args(argv)
    model = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)
    cli.check_prompt_fits(model.path, args.prompt, args.max_tokens)

    report.title("Task 1: Naive HuggingFace Inference - The Baseline")
    report.row("Prompt", f'"{args.prompt}"')
    print("Loading model with HuggingFace transformers and generating...", flush=True)
    gen = engine.hf_generate(model.path, dtype.dtype, args.prompt, args.max_tokens)

    report.section("WHAT RAN")
    report.run_info(model, dtype, gen.threads,
                    Sampling=f"do_sample=True, temperature={settings.TEMPERATURE}, "
                             f"seed={settings.SEED}, {args.max_tokens} new tokens (EOS held off)")
    report.section("RESULTS")
    report.note(f"Generated text: {gen.text[:120] + ('...' if len(gen.text) > 120 else '')!r}")
    report.row("Prompt tokens", gen.prompt_tokens)
    report.row("Generated tokens", gen.generated_tokens)
    report.row("Model load time (s)", f"{gen.load_time_s:.2f}")
    report.row("Total time (s)", engine.time_text(gen.total_time_s, gen.pass_times_s))
    report.row("Tokens per second (tok/s)", f"{gen.tokens_per_s:.1f}")
    report.insight([
        "This is SINGLE-REQUEST performance",
        "There is no batching - one request at a time",
        f"Under load, requests queue: 20 users one after another would wait about "
        f"{20 * gen.total_time_s:.0f} s for the last answer ({gen.total_time_s:.2f} s each)",
    ])

    sampling = engine.Sampling(args.prompt, args.max_tokens, settings.TEMPERATURE, settings.SEED)
    record = HFBaseline.of(gen, sampling, results.RunHeader.of(model, dtype, gen.threads))
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    return record


if __name__ == "__main__":
    cli.run(main)
