"""Task 12's record (task_12_speculative_decoding.py saves it as
results/task_12_speculative_decoding.json): everything the task measured, typed, each unit in its
field's name. A run is named by its workload ("copy" or "chat"), its level (one request at a time,
or --requests at once) and its k (guesses a step; 0: speculation off). Figures that follow from
others (the accepted share, the tokens a step, a speed-up) are properties, so a saved file
cannot disagree with itself. Each run keeps its median pass whole and every pass's tokens/s: in
mini_engine the ways (speculation off and each k) take turns, pass by pass, so a speed-up is taken
round by round; vLLM's two servers cannot take turns (a restart changes the setting), so its
speed-up's range sets each server's fastest pass against the other's slowest. summary_row is the
summary table's cell for the task."""
from __future__ import annotations

from dataclasses import dataclass, field

from common import fmt, load, measure, results

WORKLOADS = ("copy", "chat")        # the answer copies from its prompt, or it does not


def share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


@dataclass
class Settings(results.Record):
    """What the task ran with: its flags, and the sizes it chose for them."""
    ks: list[int]                   # --k: guesses a decoding request verifies a step
    vllm_k: int                     # vLLM's num_speculative_tokens: the middle of ks
    prompt_lookup_min: int          # --ngram MIN,MAX: the n-gram proposer's range
    prompt_lookup_max: int
    num_requests: int               # --requests: the level of many at once
    num_sequential: int             # the level of one: this many requests one after another
    output_tokens: int              # --output: tokens every answer makes, EOS held off
    copy_window_tokens: int         # tokens of the text each copy prompt asks to repeat
    page_size_tokens: int           # mini_engine's pages and vLLM's blocks
    max_model_len: int
    kv_cache_bytes: int             # mini_engine's: every request and its guesses at once, fp32
    port: int
    is_vllm_measured: bool          # False with --no-vllm
    base_url: str | None = None     # --base-url: vLLM's part ran there, at that server's setting
    num_passes: int = 1             # --passes: timed passes of every run
    kernels: str = "c"              # --kernels: mini_engine's EngineConfig.kernels


@dataclass
class WorkloadShape(results.Record):
    source: str                     # the text the copy prompts are cut from
    min_copy_prompt_tokens: int
    max_copy_prompt_tokens: int
    min_chat_prompt_tokens: int
    max_chat_prompt_tokens: int


@dataclass
class Check(results.Record):
    """Part 1, fp32, greedy: one workload's requests at once with k guesses a step, against the
    same with speculation off, request by request and token by token."""
    workload: str
    k: int
    num_requests: int
    num_identical: int              # requests whose every token is speculation off's
    num_tokens: int                 # tokens compared (every request's answer)
    num_tokens_identical: int       # of them, equal at the same position
    num_accepted_tokens: int        # the guesses kept: the check verified real guesses
    num_draft_tokens: int


@dataclass
class EngineRun(results.Record):
    """One workload through mini_engine at one level and one k: its median pass (by tokens/s)."""
    workload: str
    is_concurrent: bool             # --requests at once, or one request after another
    num_requests: int
    k: int                          # 0: speculation off
    duration_s: float
    num_output_tokens: int
    tokens_per_s: float             # all requests together
    mean_tpot_s: float              # time per output token after the first, per request
    num_steps: int
    num_draft_tokens: int           # guesses verified (StepStats.num_draft_tokens, summed)
    num_accepted_tokens: int        # of them kept
    # the decoding rows of every step by the tokens they gained: [rows gaining 1, 2, ..., k + 1]
    # (a row's first token, from its prompt's last chunk, is no decode and is not counted)
    steps_by_tokens: list[int]
    num_identical: int | None = None    # requests whose tokens are all speculation off's, in
                                        # the run's dtype (bf16 may round a k + 1 row apart)
    pass_tokens_per_s: list[float] = field(default_factory=list)   # every timed pass, by round
    outputs: list[list[int]] = field(default_factory=list, init=False, repr=False,
                                     compare=False)     # each request's tokens; not saved
    output_was_guess: list[list[bool]] = field(default_factory=list, init=False, repr=False,
                                               compare=False)   # per token: a kept guess

    @property
    def accepted_share(self) -> float | None:
        """Guesses kept / guesses verified (None: none were made)."""
        return share(self.num_accepted_tokens, self.num_draft_tokens)

    @property
    def tokens_per_s_spread(self) -> measure.Spread:
        return measure.Spread.of(self.pass_tokens_per_s or [self.tokens_per_s])

    @classmethod
    def median_of(cls, passes: list["EngineRun"]) -> "EngineRun":
        """A way's median pass by tokens/s, whole, with every pass's tokens/s in it."""
        run = measure.median_pass(passes, lambda r: r.tokens_per_s)
        run.pass_tokens_per_s = [r.tokens_per_s for r in passes]
        return run

    @property
    def mean_step_s(self) -> float:
        """The run's time over its steps (prefill steps included)."""
        return self.duration_s / self.num_steps

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens a decoding request gained a step, on average (1.0 without guesses)."""
        return share(sum((i + 1) * n for i, n in enumerate(self.steps_by_tokens)),
                     sum(self.steps_by_tokens))


@dataclass
class Answer(results.Record):
    """One request's answer as the figure shows it: each token's text (decoded here, so the
    figure needs no tokenizer) and whether it came as an accepted guess or as the model's own."""
    workload: str
    k: int
    tokens: list[str]
    is_guess: list[bool]            # Sequence.output_was_guess


@dataclass
class ServerRun(results.Record):
    """One workload through vLLM's server at one level, speculation off (k 0) or on."""
    workload: str
    is_concurrent: bool
    k: int | None                   # None: a --base-url server, its setting unknown here
    level: load.LoadLevel
    num_draft_tokens: int | None = None     # /metrics: vllm:spec_decode_num_draft_tokens_total
    num_accepted_tokens: int | None = None  # vllm:spec_decode_num_accepted_tokens_total
    num_same_text: int | None = None        # on: requests whose greedy text is off's, exactly
    startup_s: float | None = None          # None: a server already running was used
    pass_tokens_per_s: list[float] = field(default_factory=list)   # every timed pass, in order
    texts: list[str] = field(default_factory=list, init=False, repr=False,
                             compare=False)    # each request's streamed text; not saved

    @property
    def accepted_share(self) -> float | None:
        return share(self.num_accepted_tokens or 0, self.num_draft_tokens or 0)

    @property
    def tokens_per_s_spread(self) -> measure.Spread:
        return measure.Spread.of(self.pass_tokens_per_s or [self.level.tokens_per_s])

    @classmethod
    def median_of(cls, passes: list["ServerRun"]) -> "ServerRun":
        """A level's median pass by tokens/s, whole, every pass's tokens/s in it; a pass with a
        failed request wins, so that the report and the exit status show it."""
        failed = [r for r in passes if r.level.num_failed]
        run = failed[0] if failed else passes[measure.median_index(
            [r.level.tokens_per_s for r in passes])]
        run.pass_tokens_per_s = [r.level.tokens_per_s for r in passes]
        return run

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens a decoding request gained a step, as mini_engine's EngineRun counts them: every
        answer is its full length (EOS held off) and its first token comes from its prompt, so
        the rest were decoded, each decoding step one token and its accepted guesses: steps =
        decoded - accepted. (vLLM's own "mean acceptance length", 1 + accepted / drafts, counts
        only the steps that guessed.)"""
        if self.num_accepted_tokens is None:
            return None
        decoded = self.level.num_output_tokens - self.level.num_ok
        return share(decoded, decoded - self.num_accepted_tokens)


@dataclass
class SpeculativeDecoding(results.Result):
    """The whole run: the settings and workload, part 1's checks, parts 2-3's runs."""
    settings: Settings
    workload: WorkloadShape
    correct: list[Check]            # per workload, at the largest k
    mini_engine: list[EngineRun]    # per workload, per level (one, then many), off then each k
    answers: list[Answer]           # the first copy and chat requests alone at vllm_k
    vllm: list[ServerRun] | None = None   # per workload and level, off then on; None: --no-vllm

    def engine_run(self, workload: str, is_concurrent: bool, k: int) -> EngineRun | None:
        return next((r for r in self.mini_engine if (r.workload, r.is_concurrent, r.k) ==
                     (workload, is_concurrent, k)), None)

    def engine_speedup_spread(self, workload: str, is_concurrent: bool, k: int
                              ) -> measure.Spread | None:
        """tokens/s with k guesses a step over tokens/s without, round by round (the two took
        turns); one pass each: the one ratio."""
        off, on = (self.engine_run(workload, is_concurrent, x) for x in (0, k))
        if not (off and on):
            return None
        if on.pass_tokens_per_s and len(on.pass_tokens_per_s) == len(off.pass_tokens_per_s):
            return measure.Spread.of(a / b for a, b in zip(on.pass_tokens_per_s,
                                                           off.pass_tokens_per_s))
        return measure.Spread.of([on.tokens_per_s / off.tokens_per_s])

    def engine_speedup(self, workload: str, is_concurrent: bool, k: int) -> float | None:
        """The median round's speed-up (engine_speedup_spread's)."""
        spread = self.engine_speedup_spread(workload, is_concurrent, k)
        return spread.median if spread else None

    def server_runs(self, workload: str, is_concurrent: bool) -> tuple:
        """(off, on) of vLLM for this workload and level; None where it did not run or a
        request failed."""
        runs = [r for r in self.vllm or [] if (r.workload, r.is_concurrent) ==
                (workload, is_concurrent) and not r.level.num_failed]
        return (next((r for r in runs if r.k == 0), None),
                next((r for r in runs if r.k), None))

    def vllm_speedup_spread(self, workload: str, is_concurrent: bool) -> measure.Spread | None:
        """On's median pass over off's; the range from on's slowest over off's fastest to on's
        fastest over off's slowest (the two servers ran one after the other, not in turns)."""
        off, on = self.server_runs(workload, is_concurrent)
        if not (off and on):
            return None
        a, b = off.tokens_per_s_spread, on.tokens_per_s_spread
        return measure.Spread(on.level.tokens_per_s / off.level.tokens_per_s, b.low / a.high,
                              b.high / a.low, min(a.num_passes, b.num_passes))

    def vllm_speedup(self, workload: str, is_concurrent: bool) -> float | None:
        spread = self.vllm_speedup_spread(workload, is_concurrent)
        return spread.median if spread else None


def summary_row(res: SpeculativeDecoding) -> str:
    """mini_engine's speed-up at vLLM's k for one copy request and for --requests chats at
    once, and vLLM's for the one copy request, each with its range: 'copy 2.5x (2.4-2.6), vLLM
    2.4x (2.2-2.5); 16 chat 0.95x (0.93-0.97)' (the chats' to two places: 0.95x would read 1.0x,
    as if nothing)."""
    k = res.settings.vllm_k
    vllm = res.vllm_speedup_spread("copy", False)
    copy = fmt.times_range(res.engine_speedup_spread("copy", False, k), digits=1)
    chat = fmt.times_range(res.engine_speedup_spread("chat", True, k))
    n = res.settings.num_requests
    if vllm is None:
        return f"copy {copy}; {n} chat {chat}"
    return f"copy {copy}, vLLM {fmt.times_range(vllm, digits=1)}; {n} chat {chat}"
