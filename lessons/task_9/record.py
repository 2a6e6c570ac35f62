"""What task 9 saves (results/task_9_build_your_own_engine.json), one typed record of a run, in
the order its report prints it: the settings, part 1's check against transformers, part 2's
policies and their batching timelines, part 3's step profile (phases, the machine's bounds, the
linear layers' kernel choice), part 4's vLLM and transformers runs, and the two ratios the
summary shows. Part 2's policies and part 4's vLLM take turns (common/measure.py's in_turns): each
keeps its median pass whole and every pass's tokens/s, and each ratio is taken round by round,
its median and spread saved. task_9_build_your_own_engine.py builds it as it measures; the report
(lessons/task_9/report.py), the figures (lessons/task_9/figure.py) and the summary read it by
attribute."""
from __future__ import annotations

from dataclasses import dataclass, field

from common import fmt, measure, results, settings


@dataclass
class RunSettings(results.Record):
    """The flags of the run (mini_engine's EngineConfig names where they are the engine's)."""
    num_requests: int
    mean_output_tokens: int         # mean of the exponential output lengths
    seed: int
    max_batch: int                  # the batch cap: requests computed in one step
    page_size: int                  # tokens per KV block
    kv_bytes: int
    max_model_len: int
    policy: str                     # both, continuous or static
    temperature: float

    @classmethod
    def of(cls, args) -> "RunSettings":
        """From task 9's parsed flags and the lab's settings."""
        return cls(args.requests, args.mean_output, args.seed, args.max_batch, args.page_size,
                   args.kv_bytes, settings.MAX_MODEL_LEN, args.policy, settings.TEMPERATURE)


# --- part 1: correct ----------------------------------------------------------------------------
@dataclass
class Mismatch(results.Record):
    """The first token where the engine and transformers differ, for one prompt."""
    request: int                    # its index in CHECK_PROMPTS
    position: int                   # which new token
    engine_token_id: int
    transformers_token_id: int
    top2_logit_margin: float        # transformers' top logit minus its second, there


@dataclass
class Correctness(results.Record):
    num_prompts: int
    num_prompt_tokens: list[int]    # each prompt's length
    num_new_tokens: int             # generated per prompt, EOS held off
    num_identical: int              # prompts whose every token matched transformers
    mismatches: list[Mismatch]
    num_steps: int                  # engine steps for all prompts together


# --- part 2: the policies -----------------------------------------------------------------------
@dataclass
class PolicyRun(results.Record):
    """One batching policy on the workload, its median pass (by tokens/s) whole, every pass's
    tokens/s beside it (the summary reads num_tokens, num_steps and tokens_per_s of the continuous
    one)."""
    label: str                      # static, static no-pad or continuous
    tokens_per_s: float             # the median pass's
    duration_s: float
    num_tokens: int
    mean_latency_s: float
    p95_latency_s: float
    mean_ttft_s: float
    num_steps: int
    slot_utilization_fraction: float  # generated tokens / (batch slots x steps)
    peak_num_pages: int             # KV blocks in use at the peak
    contiguous_num_pages: int       # what reserving max_model_len per running request would hold
    num_preemptions: int
    pass_tokens_per_s: list[float] = field(default_factory=list)   # every timed pass, by round

    @property
    def tokens_per_s_spread(self) -> measure.Spread:
        return measure.Spread.of(self.pass_tokens_per_s or [self.tokens_per_s])


@dataclass
class StepTimeline(results.Record):
    """An engine's steps, compact: per step the request ids of its rows in batch order,
    space-separated, and those that were padding (a list per step would take a line per number
    in the indented JSON)."""
    seq_ids: list[str]
    padding_ids: list[str]


def timeline_record(steps) -> StepTimeline:
    """An engine's step records (mini_engine's StepStats) as task 9 saves them."""
    return StepTimeline([" ".join(map(str, s.seq_ids)) for s in steps],
                        [" ".join(map(str, s.padding_ids)) for s in steps])


# --- part 3: where the step time goes -----------------------------------------------------------
@dataclass
class Phases(results.Record):
    """Mean seconds of a decode step in each of mini_engine.profiler.PHASES, over num_steps."""
    matmul_s: float
    attention_s: float
    forward_other_s: float
    sampling_s: float
    scheduling_s: float
    step_s: float                   # the whole step
    num_steps: int

    def by_phase(self) -> dict[str, float]:
        """PHASES -> seconds, in PHASES' order."""
        return {"matmul": self.matmul_s, "attention": self.attention_s,
                "forward_other": self.forward_other_s, "sampling": self.sampling_s,
                "scheduling": self.scheduling_s}


@dataclass
class MachineBounds(results.Record):
    """What bounds a step on this machine: one read of the weights at the bandwidth, and the
    model's matmuls timed alone through F.linear (the kernel floor) at each batch profiled."""
    bandwidth_bytes_s: float
    weight_bytes: int
    weight_read_s: float
    bandwidth_from: str             # measured now, or results/machine.json
    kernel_floor_s: dict[int, float]   # batch -> seconds a step


# --- part 4: the real thing ---------------------------------------------------------------------
@dataclass
class VllmSettings(results.Record):
    """vllm.LLM's arguments (common.engine.start_engine's)."""
    max_model_len: int
    kv_cache_memory_bytes: int
    block_size: int
    enforce_eager: bool
    dtype: str
    max_num_seqs: int | None = None


@dataclass
class VllmRun(results.Record):
    """vLLM on the workload, in this process, taking turns with the policies: its median pass."""
    duration_s: float
    num_tokens: int
    tokens_per_s: float
    num_threads: int
    settings: VllmSettings
    block_size: int                 # tokens per KV block, as vLLM allocated them
    num_blocks: int
    pass_tokens_per_s: list[float] = field(default_factory=list)   # every timed pass, by round

    @property
    def tokens_per_s_spread(self) -> measure.Spread:
        return measure.Spread.of(self.pass_tokens_per_s or [self.tokens_per_s])

    @classmethod
    def of(cls, passes: list[tuple[float, int]], num_threads: int, settings: VllmSettings,
           block_size: int, num_blocks: int) -> "VllmRun":
        """From its timed passes, (seconds, tokens made) each, in round order: the median pass
        by tokens/s, every pass's tokens/s."""
        tokens_per_s = [n / s for s, n in passes]
        duration_s, num_tokens = passes[measure.median_index(tokens_per_s)]
        return cls(duration_s, num_tokens, num_tokens / duration_s, num_threads, settings,
                   block_size, num_blocks, tokens_per_s)


@dataclass
class HFRun(results.Record):
    """transformers' generate in static padded batches, one pass (a row of part 4's table only:
    neither the summary nor the insight reads it)."""
    duration_s: float
    num_tokens: int
    tokens_per_s: float


# --- the whole run ------------------------------------------------------------------------------
@dataclass
class OwnEngine(results.Result):
    settings: RunSettings
    correctness: Correctness
    workload_num_output_tokens: list[int]   # each request's output length, in arrival order
    policies: dict[str, PolicyRun]          # by label, in the order they ran
    timelines: dict[str, StepTimeline]      # by label: the batching timeline's steps
    phases: dict[int, Phases]               # batch size (1 and the fullest) -> decode step
    machine: MachineBounds
    kernels: dict[str, str]                 # what the engine ran, part by part (--kernels)
    vllm: VllmRun | None = None             # None: --no-vllm
    transformers_static: HFRun | None = None
    # tokens/s ratios, round by round (both sides of a round took turns): median and spread
    continuous_over_static_spread: measure.Spread | None = None   # both policies ran
    engine_over_vllm_spread: measure.Spread | None = None         # the best policy over vLLM
    num_kv_blocks: int | None = None        # mini_engine's pool of KV blocks (None: not saved)

    @property
    def best(self) -> PolicyRun:
        """The policy compared with vLLM: continuous where it ran, else static."""
        return self.policies.get("continuous") or self.policies["static"]

    @property
    def continuous_over_static(self) -> float | None:
        """The median round's ratio (the summary's cross-checks read it)."""
        spread = self.continuous_over_static_spread
        return spread.median if spread else None

    @property
    def engine_over_vllm(self) -> float | None:
        spread = self.engine_over_vllm_spread
        return spread.median if spread else None


def median_pass(passes: list[tuple[PolicyRun, list]]) -> tuple[PolicyRun, list]:
    """A policy's median pass by tokens/s, whole (its steps too), every pass's tokens/s in it:
    passes, (its record, its steps) each, in round order."""
    run, steps = measure.median_pass(passes, lambda p: p[0].tokens_per_s)
    run.pass_tokens_per_s = [r.tokens_per_s for r, _ in passes]
    return run, steps


def ratio_spread(numerator: PolicyRun | VllmRun, denominator: PolicyRun | VllmRun
                 ) -> measure.Spread:
    """numerator's tokens/s over denominator's, round by round (the two took turns), as a
    spread; one pass each: the one ratio."""
    if numerator.pass_tokens_per_s and denominator.pass_tokens_per_s:
        return measure.Spread.of(a / b for a, b in zip(numerator.pass_tokens_per_s,
                                                       denominator.pass_tokens_per_s))
    return measure.Spread.of([numerator.tokens_per_s / denominator.tokens_per_s])


def ratios(policies: dict[str, PolicyRun], vllm: VllmRun | None
           ) -> tuple[measure.Spread | None, measure.Spread | None]:
    """(continuous over static, the best policy over vLLM) in tokens/s, round by round; None
    where a side did not run."""
    best = policies.get("continuous") or policies["static"]
    both = "static" in policies and "continuous" in policies
    return (ratio_spread(policies["continuous"], policies["static"]) if both else None,
            ratio_spread(best, vllm) if vllm else None)


@dataclass
class RoundSplit:
    """Continuous over static in one round, split in two factors that multiply to it: static
    without padding over static (not computing finished rows), continuous over static without
    padding (refilling their slots)."""
    total: float
    padding: float
    refill: float


def median_round_split(policies: dict[str, PolicyRun]) -> RoundSplit | None:
    """The round whose continuous-over-static ratio is the median one (the figure
    continuous_over_static_spread states), split by that same round's static no-pad pass: the
    two factors multiply to the total exactly. (The medians of the three ratios taken apart, each
    from its own round, need not: that printed 1.29x and 1.38x under a 1.86x.) None unless all
    three policies ran."""
    if not {"static", "static no-pad", "continuous"} <= set(policies):
        return None
    static, nopad, cont = (policies[k] for k in ("static", "static no-pad", "continuous"))
    passes = [r.pass_tokens_per_s or [r.tokens_per_s] for r in (static, nopad, cont)]
    rounds = list(zip(*passes))
    at = measure.median_index([c / s for s, _, c in rounds])
    s, n, c = rounds[at]
    return RoundSplit(c / s, n / s, c / n)


def summary_row(e: OwnEngine) -> str:
    """The summary's cell: continuous vs static on the same engine, engine vs vLLM, each the
    median round with the range of the rounds."""
    parts = [f"{e.correctness.num_identical}/{e.correctness.num_prompts} = HF"]
    if e.continuous_over_static_spread is not None:
        parts.append(fmt.times_range(e.continuous_over_static_spread, "static"))
    if e.engine_over_vllm_spread is not None:
        parts.append(fmt.times_range(e.engine_over_vllm_spread, "vLLM"))
    return ", ".join(parts)
