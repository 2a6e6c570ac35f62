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
from lessons.task_1.report import print_report

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

    print_report(gen, model, dtype, args.max_tokens)

    sampling = engine.Sampling(args.prompt, args.max_tokens, settings.TEMPERATURE, settings.SEED)
    record = HFBaseline.of(gen, sampling, results.RunHeader.of(model, dtype, gen.threads))
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    return record


if __name__ == "__main__":
    cli.run(main)
