"""Task 2: vLLM Offline Inference - see the difference.

Runs the same model, prompt and sampling as task 1 with vllm.LLM (in-process CPU engine,
max_model_len 128, 128 MiB KV cache, enforce_eager), after one untimed warm-up. Prints the
result, the HuggingFace-vs-vLLM comparison (task 1's saved result when it matches, else the
baseline measured here), and the KV capacity the engine allocated beside the same figure derived
from the model config: bytes per token x 128 MiB, in whole blocks. The two must agree.

    python task_2_vllm_inference.py [--model M] [--dtype auto|bfloat16|float32] [--prompt TEXT]
"""
from __future__ import annotations

from common import cli, engine, figures, kv, report, results, settings
from lessons.task_2 import FIGURES
from lessons.task_2.record import Baseline, Capacity, EngineSettings, VLLMInference
from lessons.task_2.report import compare_capacity, insights, print_results, print_what_ran

SCRIPT = "task_2_vllm_inference"
BASELINE_SCRIPT = "task_1_hf_baseline"


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    cli.add_model_args(parser)
    cli.add_sampling_args(parser)
    return parser.parse_args(argv)


def load_baseline(model, dtype: str, prompt: str, max_tokens: int) -> Baseline:
    """Task 1's saved result if it measured the same thing, else measure the baseline here."""
    try:
        saved = results.load(BASELINE_SCRIPT, engine.OneRequest, "task 1")
    except results.StaleResult as e:
        report.note(f"({e})")
        saved = None
    if (saved and saved.header.model_path == model.path and saved.header.dtype == dtype
            and saved.settings.prompt == prompt and saved.settings.max_new_tokens == max_tokens
            and saved.total_time_s):
        return Baseline(f"task 1's saved result ({saved.measured_at})", saved.tokens_per_s,
                        saved.total_time_s,
                        [saved.generated_tokens / t for t in saved.pass_times_s])
    report.note("No matching task 1 result saved: measuring the HuggingFace baseline now...")
    gen = engine.hf_generate(model.path, dtype, prompt, max_tokens)
    return Baseline("measured now", round(gen.tokens_per_s, 2), gen.total_time_s,
                    [gen.generated_tokens / t for t in gen.pass_times_s])


def result(args, gen: engine.Generation, eng: engine.Engine, baseline: Baseline, speedup: float,
           capacity: kv.KVCapacity, derived: kv.KVCapacity, model_kv: kv.ModelKV, agree: bool,
           header: results.RunHeader) -> VLLMInference:
    """What task 2 saves: the generation, the comparison, the capacity read and derived."""
    e = eng.settings
    asked = EngineSettings(args.prompt, args.max_tokens, settings.TEMPERATURE, settings.SEED,
                           e["max_model_len"], e["kv_cache_memory_bytes"], e["block_size"],
                           e["enforce_eager"], e["dtype"])
    return VLLMInference.of(gen, asked, header, baseline=baseline, speedup=round(speedup, 2),
                            kv_capacity_engine=Capacity.of(capacity),
                            kv_capacity_derived=Capacity.of(derived, model_kv.bytes_per_token),
                            kv_capacity_agree=agree)


def main(argv: list[str] | None = None) -> VLLMInference:
    args = parse_args(argv)
    model = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)
    cli.check_prompt_fits(model.path, args.prompt, args.max_tokens)

    report.title("Task 2: vLLM Offline Inference - See the Difference")
    report.row("Prompt", f'"{args.prompt}"')
    baseline = load_baseline(model, dtype.dtype, args.prompt, args.max_tokens)
    print("Initializing vLLM engine...", flush=True)
    eng = engine.start_engine(model.path, dtype.dtype)
    print(f"vLLM engine ready ({eng.init_time_s:.1f} s). Generating with vLLM...", flush=True)
    gen = engine.vllm_generate(eng, args.prompt, args.max_tokens)
    capacity = engine.engine_capacity(eng)

    print_what_ran(model, dtype, gen, eng, args.max_tokens)
    speedup = print_results(gen, eng, baseline)
    # derived from what the lab asked for (block size, max_model_len), never read back from the
    # engine, so the check fails if the engine did not apply it
    model_kv = kv.ModelKV.from_folder(model.path, dtype.dtype)
    derived, agree = compare_capacity(capacity, model_kv, eng.settings["block_size"],
                                      eng.settings["max_model_len"])
    report.insight(insights(gen, baseline, capacity))

    record = result(args, gen, eng, baseline, speedup, capacity, derived, model_kv, agree,
                    results.RunHeader.of(model, dtype, gen.threads))
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    return record


if __name__ == "__main__":
    cli.run(main)
