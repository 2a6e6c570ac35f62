"""mini_engine's scheduler and engine, searched for a counter-example by hypothesis.

One example per path is not enough for a scheduler: a static batch left holding only padding rows
once looped for ever under a tight pool, and the example tests had preempted only under the
continuous policy. So the invariants are stated here and hypothesis draws the cases: workloads
(prompt and output lengths, EOS held off or allowed), KV budgets from exactly one request's pages
up to plenty, page sizes, batch caps, both policies, padding on and off, and the step's token
budget (issue 23) from the least the config allows (the cap with chunking, so 1 at a cap of 1;
max_model_len without) up to one that never binds, chunking on and off, and the engine's
kernels (EngineConfig.kernels: torch, C, compiled). On the tiny random model
the tests build (tiny_llama, tests/conftest.py: 2 layers, a vocabulary of 1,024, so token ids
are drawn from 1 to 1,023), each case takes milliseconds. Counts, pages and tokens are asserted,
never times.

Invariants, checked at every step:
- pages are conserved: free + held = total, no held page on the free queue (so none is handed
  out again while a request holds it), each page's ref count the number of page tables it is in
  and never negative (with the prefix cache off: no page in two tables), and a request that is
  not running holds none;
- nothing is preempted while the pool has room for what is running (free pages plus those of
  padding rows, which are dropped first);
- no step computes more tokens than the budget, nor more rows than the cap;
- no token is sampled before its prompt is complete: a request makes a token in a step exactly
  when that step computes its last known token, and a chunk short of it makes none;
- no decode stalls: a request with one token left to compute is computed in every step (or
  preempted in it);
- pages are allocated for what is computed: a running request holds cdiv(num_cached,
  page_size) pages, and has registered in the prefix cache only pages whose K/V is computed;
and at the end:
- the run ended within sum(ceil(len(prompt) / (budget - cap + 1)) + max_tokens - 1) steps, the
  bound mini_engine/scheduler.py proves; sum(max_tokens), the bound before the token budget, when
  budget - cap + 1 is at least the longest prompt (so every case of a budget that never binds
  still ends within it);
- every request has exactly its tokens when EOS is held off (else it stopped at EOS or its max);
- each request's greedy tokens equal the same request run alone in a roomy pool without the
  prefix cache and without chunks, the torch way (so neither the cache, the budget nor the
  kernels change a token);
- every page is free again, every ref count zero.

Half the cases turn the prefix cache on, and the workloads share a drawn prefix (a system prompt),
whole or in part, so pages are shared, hit, kept after their requests end and evicted.

Speculative decoding (issue 24), test_speculative_decoding_changes_no_token: the same engine
settings with k = 1..8 guesses a decode, the n-gram proposer's min and max n drawn, and
repetitive prompts (a few token ids drawn per case, the prompts made of them), so the proposer
finds matches; the tiny model's greedy output repeats its last token, and mostly, not always:
guesses are kept and rejected. EOS is off, held off by min_tokens in every row, or allowed from
a drawn min_tokens on. Checked at every step:
- pages conserved (check_pages), a running request holding cdiv(num_cached, page_size) pages
  (rejected guesses' pages given back), a decoding row rolled back to num_tokens - 1 cached, no
  page registered before its K/V is computed, and a registered page in a page table holding
  that request's tokens (so never a rejected guess);
- no step over the budget or the cap; nothing preempted while the pool had room;
- a decoding row computes its token and g guesses, g at most what the proposer proposes on its
  tokens cut at max_tokens and max_model_len, and fewer only when the step spent the whole
  budget or every page (a guess never preempts); it gains 1 to g + 1 tokens, the kept guesses
  a prefix of the proposal, flagged in output_was_guess; a prefill chunk gains at most 1;
- the step's draft and accepted counts are the sums of its rows';
and at the end: every workload ended within scheduler.step_bound (a decode makes at least its
one token), each request has exactly its tokens when EOS is off or held off, its greedy tokens
are those it makes alone without speculation (run_alone), accepted <= draft for every request
and summed over the steps, and every page is free.
"""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from mini_engine import EngineConfig, LLMEngine, Llama, State
from mini_engine.block_manager import cdiv
from mini_engine.kv_quant import bytes_per_token
from mini_engine.model import GroupMember, split_by_context
from mini_engine.proposer import NgramProposer
from mini_engine.scheduler import step_bound
from tests.helpers import SMALL_VOCAB as VOCAB     # tiny_llama's vocabulary

MAX_MODEL_LEN = 40      # short, so a drawn workload fills a small pool quickly
ROOMY_PAGES = 64        # the reference run: one request alone never preempted
ROOMY_BUDGET = 4096     # EngineConfig's default: every step's tokens fit (5 x 40 at most)
AUTO = ("auto", "token")  # the KV cache in the model's dtype (kv_cache_dtype, kv_scale)
# "EOS allowed" makes every even token id an end of sequence, so about half the tokens a random
# model picks end their request: the early-finish paths run in most cases, not once in 1,024.
EOS_IDS = list(range(0, VOCAB, 2))
TOKEN_IDS = st.integers(1, VOCAB - 1)     # a prompt's token ids: any of the vocabulary but 0

_alone: dict = {}       # reference outputs, one engine run per distinct request


def kv_bytes(model: Llama, num_pages: int, page_size: int, kv: tuple = AUTO) -> int:
    """The budget of num_pages pages in the KV cache's format kv: (kv_cache_dtype, kv_scale)."""
    return num_pages * page_size * bytes_per_token(model.num_layers, model.num_kv_heads,
                                                   model.head_dim, *kv, model.dtype)


def run_alone(model: Llama, prompt: tuple, max_tokens: int, min_tokens: int, eos: tuple,
              kv: tuple = AUTO) -> list:
    """The tokens a request makes alone, its prompt in one step, the torch way (kernels "torch"),
    the KV cache in format kv (an 8-bit cache quantizes each token's K and V on their own, so a
    batch changes none of them)."""
    key = (prompt, max_tokens, min_tokens, eos, kv)
    if key not in _alone:
        eng = LLMEngine(model, list(eos), EngineConfig(
            kv_bytes=kv_bytes(model, ROOMY_PAGES, 16, kv), page_size=16, max_batch=1,
            max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=False, kv_cache_dtype=kv[0],
            kv_scale=kv[1]))
        seq = eng.add_request(list(prompt), max_tokens, min_tokens)
        eng.run()
        _alone[key] = seq.output_ids
    return _alone[key]


def test_the_token_ids_drawn_are_the_models_vocabulary(tiny_llama):
    """VOCAB, which the strategies below and EOS_IDS are made of, is tiny_llama's vocabulary."""
    assert tiny_llama.shape.vocab_size == VOCAB == tiny_llama.embed.shape[0]


@st.composite
def requests(draw, shared: tuple):
    """A prompt that starts with the shared prefix (or a part of it, or not at all)."""
    head = shared[:draw(st.integers(0, len(shared)))]
    tail_len = draw(st.integers(0 if head else 1, 24 - len(head)))
    prompt = head + tuple(draw(st.lists(TOKEN_IDS, min_size=tail_len, max_size=tail_len)))
    return prompt, draw(st.integers(1, MAX_MODEL_LEN - len(prompt)))


@st.composite
def engine_settings(draw, page_size: int) -> dict:
    """The engine's side of a case, drawn after its workload (as hypothesis shrinks and leans,
    the order of the draws shapes the cases it reaches): pool (from exactly one request's pages
    to three), batch cap, policy, padding, chunking and the step's token budget."""
    one_request = cdiv(MAX_MODEL_LEN, page_size)      # the least budget the engine accepts
    return {"page_size": page_size,
            "num_pages": draw(st.integers(one_request, 3 * one_request)),
            "max_batch": (max_batch := draw(st.integers(1, 5))),
            "policy": draw(st.sampled_from(["continuous", "static"])),
            "pad_finished": draw(st.booleans()),
            # chunking on in most cases (hypothesis leans to False, its simplest boolean)
            "chunking": (chunking := not draw(st.booleans())),
            # from the least the config allows (1 at a cap of 1, with chunks) to never binding
            "budget": draw(st.sampled_from([0, 1, 2, 5, 13, ROOMY_BUDGET])
                           .map(lambda extra, least=max_batch if chunking else MAX_MODEL_LEN:
                                least + extra)),
            # EngineConfig.kernels: the torch way (gather + SDPA, F.linear); "c", the pages read
            # in place by paged_attention.c, the packed product, the 8-bit cache in C; or
            # "compiled", the same with the forward one graph of torch.compile (torch keeps the
            # graphs for the process, so the search compiles once, at the first case that
            # draws it)
            "kernels": (kernels := draw(st.sampled_from(["torch", "c", "compiled"]))),
            # task 14: the KV cache in 8 bits, each format and scale (the compiled forward runs
            # the model's own pools only)
            "kv": AUTO if kernels == "compiled" else draw(st.sampled_from(
                [AUTO, ("fp8", "token"), ("fp8", "layer"), ("fp8_e5m2", "token")]))}


@st.composite
def cases(draw):
    page_size = draw(st.sampled_from([1, 3, 4, 8, 16]))
    # a prefix several requests share (a system prompt), so the prefix cache has hits to take
    shared = tuple(draw(st.lists(TOKEN_IDS, min_size=0, max_size=20)))
    return {"workload": draw(st.lists(requests(shared), min_size=1, max_size=7)),
            "prefix_caching": draw(st.booleans()),
            "eos_held_off": draw(st.booleans()),
            **draw(engine_settings(page_size))}


def check_pages(eng: LLMEngine) -> None:
    """Each page is either free (on the free queue, nobody holds it) or held, its ref count the
    number of page tables it is in (shared prefix pages counted once in the pool)."""
    bm, running = eng.block_manager, eng.scheduler.running
    refs = Counter(page for seq in running for page in seq.page_table)
    free = list(bm.free_queue)
    assert all(len(set(s.page_table)) == len(s.page_table) for s in running), \
        "a page twice in one page table"
    if not bm.enable_prefix_caching:
        assert all(n == 1 for n in refs.values()), "a page in two page tables without the cache"
    assert all(bm.blocks[page].ref_count == n for page, n in refs.items()), "a wrong ref count"
    assert all(b.ref_count >= 0 for b in bm.blocks), "a negative ref count"
    assert not set(refs) & set(free), "a held page on the free queue (it could be handed out)"
    assert len(refs) + len(free) == eng.num_pages, "pages lost or made up"
    assert all(not s.page_table for s in eng.sequences if s not in running), \
        "a request that is not running holds pages"
    for h, page in bm.hash_to_block_id.items():     # the cache maps each hash to its one page
        assert bm.blocks[page].hash == h


def room_for_running(eng: LLMEngine) -> bool:
    """Could every live running request take its next token's pages without preempting one?"""
    bm, running = eng.block_manager, eng.scheduler.running
    need = sum(bm.num_pages_needed(s, s.num_tokens) for s in running if not s.is_padding)
    padding = sum(len(s.page_table) for s in running if s.is_padding)
    return need <= bm.num_free + padding


def check_budget(eng: LLMEngine, case: dict, before: dict) -> int:
    """This step's tokens within the budget, a token made only by a step that computed its
    request's last known token, every decode computed, pages held for what is computed.
    before: seq_id -> (outputs, was decoding) at the step's start. Returns how many live rows
    computed a chunk that made no token."""
    step, page_size = eng.steps[-1], case["page_size"]
    assert step.num_tokens == sum(step.num_scheduled_tokens) \
        == step.num_prefill_tokens + step.num_decode_tokens
    assert 1 <= step.num_tokens <= case["budget"], "a step over the token budget"
    assert min(step.num_scheduled_tokens) >= 1, "a row that computes nothing"
    live_rows = set(step.seq_ids) - set(step.padding_ids)
    num_short = 0
    for seq in eng.sequences:
        num_outputs, decoding = before[seq.seq_id]
        made = len(seq.output_ids) - num_outputs
        if seq.seq_id not in live_rows:
            assert made == 0, f"request {seq.seq_id} made a token in a step it was not computed"
        elif seq.is_finished and seq not in eng.scheduler.running:
            assert made == 1, f"request {seq.seq_id} finished without a token"   # left at once
        elif made:    # the token just made is the one token not computed: the chunk reached it
            assert made == 1 and seq.num_cached == seq.num_tokens - 1, \
                f"request {seq.seq_id} sampled from a chunk short of its last known token"
        else:         # no token: the chunk stopped short of the last known token
            assert seq.num_cached < seq.num_tokens, \
                f"request {seq.seq_id} computed its last known token and made no token"
            num_short += 1
        assert not decoding or seq.seq_id in live_rows or seq.state is State.PREEMPTED, \
            f"request {seq.seq_id} was decoding and waited a step"
    for seq in eng.scheduler.running:
        assert len(seq.page_table) == cdiv(seq.num_cached, page_size), \
            "pages held for tokens not computed"
        assert seq.num_registered <= seq.num_cached // page_size, \
            "a page registered in the prefix cache before its K/V was computed"
    return num_short


def engine_of(model: Llama, case: dict) -> tuple:
    """The case's engine, warmed up, its workload added: (engine, EOS ids, each request's
    min_tokens, the requests, scheduler.step_bound of the workload)."""
    eos = () if case["eos_held_off"] else tuple(EOS_IDS)
    eng = LLMEngine(model, list(eos), EngineConfig(
        kv_bytes=kv_bytes(model, case["num_pages"], case["page_size"], case["kv"]),
        page_size=case["page_size"], max_batch=case["max_batch"], max_model_len=MAX_MODEL_LEN,
        policy=case["policy"], pad_finished=case["pad_finished"],
        enable_prefix_caching=case["prefix_caching"],
        max_num_batched_tokens=case["budget"], enable_chunked_prefill=case["chunking"],
        kernels=case["kernels"], kv_cache_dtype=case["kv"][0], kv_scale=case["kv"][1]))
    eng.warm_up()
    min_tokens = [n if case["eos_held_off"] else 0 for _, n in case["workload"]]
    seqs = [eng.add_request(list(p), n, m) for (p, n), m in zip(case["workload"], min_tokens)]
    bound = step_bound([len(p) for p, _ in case["workload"]], [n for _, n in case["workload"]],
                       case["budget"], case["max_batch"])
    return eng, eos, min_tokens, seqs, bound


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(case=cases())
def test_scheduler_invariants(tiny_llama, case):
    eng, eos, min_tokens, seqs, bound = engine_of(tiny_llama, case)
    if case["budget"] - case["max_batch"] + 1 >= max(len(p) for p, _ in case["workload"]):
        assert bound == sum(n for _, n in case["workload"])     # the bound before the budget
    num_short = 0
    while eng.scheduler.has_work:
        assert len(eng.steps) < bound, f"no end within {bound} steps (scheduler.step_bound)"
        roomy, preempted = room_for_running(eng), eng.scheduler.num_preemptions
        before = {s.seq_id: (len(s.output_ids), s in eng.scheduler.running and s.is_decoding)
                  for s in seqs}
        eng.step()
        assert not (roomy and eng.scheduler.num_preemptions > preempted), \
            "preempted while the pool had room for every running request"
        assert eng.steps[-1].num_live >= 1 and eng.steps[-1].num_rows <= case["max_batch"]
        num_short += check_budget(eng, case, before)
        check_pages(eng)
    assert eng.block_manager.num_free == eng.num_pages
    assert all(b.ref_count == 0 for b in eng.block_manager.blocks)
    for seq, (prompt, n), m in zip(seqs, case["workload"], min_tokens):
        assert seq.state is State.FINISHED and seq.page_table == []
        if case["eos_held_off"]:
            assert len(seq.output_ids) == n
        else:
            assert 1 <= len(seq.output_ids) <= n
            assert len(seq.output_ids) == n or seq.output_ids[-1] in eos
        assert len(seq.token_times_s) == len(seq.output_ids)
        assert seq.output_ids == run_alone(tiny_llama, prompt, n, m, eos, case["kv"])
    # what the cases reached (pytest --hypothesis-show-statistics lists them)
    least = case["max_batch"] if case["chunking"] else MAX_MODEL_LEN
    event(f"chunking {'on' if case['chunking'] else 'off'}, budget "
          + ("1" if case["budget"] == 1 else "the least" if case["budget"] == least else
             "roomy" if case["budget"] >= ROOMY_BUDGET else "between"))
    event(f"a prefill cut into chunks: {num_short > 0}")
    event(f"preempted: {eng.scheduler.num_preemptions > 0}")
    event(f"kernels: {case['kernels']}")
    event(f"KV cache: {' '.join(case['kv'])}")
    if not case["eos_held_off"]:
        event(f"EOS allowed, a request ended at it before max_tokens: "
              f"{any(len(s.output_ids) < n for s, (_, n) in zip(seqs, case['workload']))}")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(case=cases(), data=st.data())
def test_aborts_give_every_page_back_and_change_no_other_token(tiny_llama, case, data):
    """A client that goes away: the server aborts its request between two steps
    (LLMEngine.abort, mini_engine/server/). Any request, at any step between: waiting, running,
    preempted, a padding row, or finished already (then nothing happens). Checked after every
    abort and every step: pages conserved (check_pages), the aborted request out of the line and
    the batch with no page, and every step within its bound; at the end every page free, each
    request not aborted exactly the tokens it makes alone, and each aborted one a prefix of
    them (an abort changes no neighbour's token)."""
    eng, eos, min_tokens, seqs, bound = engine_of(tiny_llama, case)
    aborted = set()
    while eng.scheduler.has_work:
        if data.draw(st.booleans(), label="abort before this step"):
            victim = data.draw(st.sampled_from(seqs), label="which request")
            if not victim.is_finished:
                aborted.add(victim.seq_id)
                event(f"aborted while {victim.state.value}")
            eng.abort(victim)
            assert victim.is_finished and victim not in eng.scheduler.waiting
            # a padding row is done already: it keeps its row and pages until its batch ends
            assert victim.is_padding or (victim.page_table == []
                                         and victim not in eng.scheduler.running)
            check_pages(eng)
            if not eng.scheduler.has_work:
                break
        assert len(eng.steps) < bound, f"no end within {bound} steps (scheduler.step_bound)"
        eng.step()
        check_pages(eng)
    assert eng.block_manager.num_free == eng.num_pages
    assert all(b.ref_count == 0 for b in eng.block_manager.blocks)
    for seq, (prompt, n), m in zip(seqs, case["workload"], min_tokens):
        alone = run_alone(tiny_llama, prompt, n, m, eos, case["kv"])
        if seq.seq_id in aborted:
            assert seq.output_ids == alone[:len(seq.output_ids)]
        else:
            assert seq.output_ids == alone
    event(f"requests aborted: {min(len(aborted), 2)}{'+' if len(aborted) > 2 else ''}")


@pytest.mark.parametrize("policy, pad", [("static", True), ("static", False),
                                         ("continuous", True)])
def test_a_pool_of_one_request_with_more_requests_than_the_cap_ends(tiny_llama, policy, pad):
    """The hang task 9 once had. A pool of exactly one full request (3 pages of 16 tokens for
    max_model_len 40), a cap of 2, three pairs of requests: a 20-token prompt making 4 tokens
    (2 pages), then a 10-token prompt making 25 (1 page, growing to 3). The pair fills the pool;
    the first finishes at 24 tokens and stays as padding; the second needs a page at 16 tokens
    and none is free. It used to preempt the newest request, itself, leaving a batch of padding
    alone that static batching stepped for ever. Now the padding row goes first. Each request
    makes exactly its tokens, the ones it makes alone."""
    eng = LLMEngine(tiny_llama, [], EngineConfig(
        kv_bytes=kv_bytes(tiny_llama, 3, 16), page_size=16, max_batch=2,
        max_model_len=MAX_MODEL_LEN, policy=policy, pad_finished=pad))
    workload = [(tuple(range(100 + 30 * i, 120 + 30 * i)), 4) if i % 2 == 0 else
                (tuple(range(100 + 30 * i, 110 + 30 * i)), 25) for i in range(6)]
    seqs = [eng.add_request(list(p), n, min_tokens=n) for p, n in workload]
    eng.run()
    assert len(eng.steps) <= 3 * (4 + 25)
    assert [len(s.output_ids) for s in seqs] == [4, 25] * 3
    assert [s.output_ids for s in seqs] == \
        [run_alone(tiny_llama, p, n, n, ()) for p, n in workload]
    assert eng.block_manager.num_free == eng.num_pages


# --- speculative decoding (issue 24) --------------------------------------------------------------
@st.composite
def repetitive_requests(draw, alphabet: tuple, shared: tuple):
    """A prompt of the case's few token ids (after the shared prefix, or a part of it), so its
    n-grams recur and the proposer has something to find."""
    head = shared[:draw(st.integers(0, len(shared)))]
    tail_len = draw(st.integers(0 if head else 1, 24 - len(head)))
    prompt = head + tuple(draw(st.lists(st.sampled_from(alphabet), min_size=tail_len,
                                        max_size=tail_len)))
    room = MAX_MODEL_LEN - len(prompt)
    # half the draws from the longer half: a guess needs a decode or two before it (hypothesis
    # leans to small integers, and a request of 1 to 3 tokens rarely guesses)
    return prompt, draw(st.integers(1, room) | st.integers(max(1, room // 2), room))


@st.composite
def spec_cases(draw):
    page_size = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    alphabet = tuple(draw(st.lists(TOKEN_IDS, min_size=2, max_size=4, unique=True)))
    shared = tuple(draw(st.lists(st.sampled_from(alphabet), max_size=16)))
    workload = draw(st.lists(repetitive_requests(alphabet, shared), min_size=1, max_size=5))
    n_min = draw(st.integers(1, 3))
    eos = draw(st.sampled_from(["off", "held off", "allowed"]))
    return {"workload": workload,
            # per request: min_tokens (EOS "held off": all its tokens; "allowed": from a draw)
            "min_tokens": [n if eos == "held off" else
                           draw(st.integers(0, n)) if eos == "allowed" else 0
                           for _, n in workload],
            "eos": eos,
            "k": draw(st.integers(1, 8)),
            "n": (n_min, draw(st.integers(n_min, 5))),
            "prefix_caching": draw(st.booleans()),
            **draw(engine_settings(page_size))}


def check_spec_step(eng: LLMEngine, case: dict, before: dict, proposer: NgramProposer) -> set:
    """This step's rows against the rules of speculative decoding (the test's docstring).
    before: seq_id -> (outputs, was decoding, token ids, preemptions) at the step's start (a
    request preempted in the step and admitted again computes a prefill, not a decode). Returns
    what the step reached, for the events."""
    step, page_size, reached = eng.steps[-1], case["page_size"], set()
    assert step.num_tokens == sum(step.num_scheduled_tokens) \
        == step.num_prefill_tokens + step.num_decode_tokens
    assert 1 <= step.num_tokens <= case["budget"], "a step over the token budget"
    assert 1 <= step.num_live and step.num_rows <= case["max_batch"]
    assert min(step.num_scheduled_tokens) >= 1, "a row that computes nothing"
    assert 0 <= step.num_accepted_tokens <= step.num_draft_tokens <= step.num_decode_tokens
    assert len(step.num_output_tokens) == step.num_rows
    num_draft = num_accepted = 0
    for seq_id, n, gained in zip(step.seq_ids, step.num_scheduled_tokens, step.num_output_tokens):
        seq = eng.sequences[seq_id]
        num_out, decoding, tokens, num_preemptions = before[seq_id]
        decoding = decoding and seq.num_preemptions == num_preemptions   # not preempted here
        assert len(seq.output_ids) - num_out == gained, "num_output_tokens is not what it gained"
        if seq_id in step.padding_ids:
            assert n == 1 and gained == 0
            continue
        if not decoding:                  # a prefill chunk: no guesses, a token at most
            assert gained <= 1
            continue
        guesses = n - 1
        cap = min(seq.max_tokens - num_out - 1, MAX_MODEL_LEN - len(tokens) - 1)
        proposal = proposer.propose(list(tokens), max(cap, 0))
        assert guesses <= len(proposal), \
            f"request {seq_id}: {guesses} guesses, the proposer cut at max_tokens and " \
            f"max_model_len has {len(proposal)}"
        if guesses < len(proposal):
            assert step.num_tokens == case["budget"] or step.num_pages_used == eng.num_pages, \
                f"request {seq_id}'s guesses cut with budget and pages left"
            reached.add("budget" if step.num_tokens == case["budget"] else "pages")
        elif len(proposal) < len(proposer.propose(list(tokens))):
            reached.add("max_tokens")
        assert 1 <= gained <= n, f"request {seq_id} decoded and gained {gained} of {n}"
        flags = seq.output_was_guess[num_out:]
        accepted = sum(flags)
        # the kept guesses, then the model's token (none after a guess that was an EOS)
        assert flags == [True] * accepted + [False] * (gained - accepted)
        assert gained - 1 <= accepted <= guesses
        assert seq.output_ids[num_out:num_out + accepted] == proposal[:accepted]
        num_draft, num_accepted = num_draft + guesses, num_accepted + accepted
        if seq in eng.scheduler.running and not seq.is_padding:
            assert seq.num_cached == seq.num_tokens - 1, f"request {seq_id} not rolled back"
    assert (num_draft, num_accepted) == (step.num_draft_tokens, step.num_accepted_tokens)
    for seq in eng.sequences:
        if seq.seq_id not in step.seq_ids:
            assert len(seq.output_ids) == before[seq.seq_id][0], \
                f"request {seq.seq_id} made a token in a step it was not computed"
    bm = eng.block_manager
    for seq in eng.scheduler.running:
        assert len(seq.page_table) == cdiv(seq.num_cached, page_size), \
            "pages held for tokens not computed (a rejected guess's page kept?)"
        assert seq.num_registered <= seq.num_cached // page_size, \
            "a page registered in the prefix cache before its K/V was computed"
        for i, page in enumerate(seq.page_table):
            if bm.blocks[page].hash is not None:
                assert bm.blocks[page].token_ids == tuple(
                    seq.token_ids[i * page_size:(i + 1) * page_size]), \
                    "a cached page holds tokens its request does not have (a rejected guess?)"
    return reached


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(case=spec_cases())
def test_speculative_decoding_changes_no_token(tiny_llama, case):
    eos = () if case["eos"] == "off" else tuple(EOS_IDS)
    eng = LLMEngine(tiny_llama, list(eos), EngineConfig(
        kv_bytes=kv_bytes(tiny_llama, case["num_pages"], case["page_size"], case["kv"]),
        page_size=case["page_size"], max_batch=case["max_batch"], max_model_len=MAX_MODEL_LEN,
        policy=case["policy"], pad_finished=case["pad_finished"],
        enable_prefix_caching=case["prefix_caching"],
        max_num_batched_tokens=case["budget"], enable_chunked_prefill=case["chunking"],
        num_speculative_tokens=case["k"], prompt_lookup_min=case["n"][0],
        prompt_lookup_max=case["n"][1], kernels=case["kernels"],
        kv_cache_dtype=case["kv"][0], kv_scale=case["kv"][1]))
    eng.warm_up()
    proposer = NgramProposer(case["k"], *case["n"])
    seqs = [eng.add_request(list(p), n, m) for (p, n), m in zip(case["workload"],
                                                                case["min_tokens"])]
    bound = step_bound([len(p) for p, _ in case["workload"]], [n for _, n in case["workload"]],
                       case["budget"], case["max_batch"])
    reached = set()
    while eng.scheduler.has_work:
        assert len(eng.steps) < bound, f"no end within {bound} steps (scheduler.step_bound)"
        roomy, preempted = room_for_running(eng), eng.scheduler.num_preemptions
        before = {s.seq_id: (len(s.output_ids), s in eng.scheduler.running and s.is_decoding,
                             tuple(s.token_ids), s.num_preemptions) for s in seqs}
        eng.step()
        assert not (roomy and eng.scheduler.num_preemptions > preempted), \
            "preempted while the pool had room for every running request"
        reached |= check_spec_step(eng, case, before, proposer)
        check_pages(eng)
    assert eng.block_manager.num_free == eng.num_pages
    assert all(b.ref_count == 0 for b in eng.block_manager.blocks)
    for seq, (prompt, n), m in zip(seqs, case["workload"], case["min_tokens"]):
        assert seq.state is State.FINISHED and seq.page_table == []
        if case["eos"] != "allowed":
            assert len(seq.output_ids) == n
        else:
            assert 1 <= len(seq.output_ids) <= n
            assert len(seq.output_ids) == n or seq.output_ids[-1] in eos
        assert len(seq.token_times_s) == len(seq.output_ids) == len(seq.output_was_guess)
        assert seq.num_accepted_tokens <= seq.num_draft_tokens
        assert sum(seq.output_was_guess) == seq.num_accepted_tokens
        assert seq.output_ids == run_alone(tiny_llama, prompt, n, m, eos, case["kv"])
    assert sum(s.num_draft_tokens for s in eng.steps) == sum(s.num_draft_tokens for s in seqs)
    assert sum(s.num_accepted_tokens for s in eng.steps) == \
        sum(s.num_accepted_tokens for s in seqs)
    # what the cases reached (pytest --hypothesis-show-statistics lists them)
    num_draft = sum(s.num_draft_tokens for s in seqs)
    num_accepted = sum(s.num_accepted_tokens for s in seqs)
    event(f"guesses kept: {num_accepted > 0}, rejected: {num_draft > num_accepted}")
    event(f"preempted with guesses made: {eng.scheduler.num_preemptions > 0 and num_draft > 0}")
    for why in sorted(reached):
        event(f"guesses cut by {why}")
    event(f"EOS {case['eos']}")
    event(f"kernels: {case['kernels']}")
    event(f"KV cache: {' '.join(case['kv'])}")
    if case["eos"] == "allowed":
        event(f"EOS allowed, a request ended at it before max_tokens: "
              f"{any(len(s.output_ids) < n for s, (_, n) in zip(seqs, case['workload']))}")
    event(f"an EOS among the kept guesses: "
          f"{any(s.output_was_guess[-1:] == [True] and s.output_ids[-1] in eos for s in seqs)}")


@given(members=st.lists(st.tuples(st.integers(0, 100), st.integers(1, 8)), max_size=20),
       call_slots=st.integers(1, 300))
def test_attention_calls_hold_every_request_once_within_their_slots(members, call_slots):
    """split_by_context (issue 29): every request in exactly one call; a call of several requests
    reads at most call_slots padded slots; calls are neighbours by context length; a batch that
    fits stays one call in its rows' order (the forward's shortcut for one call relies on it)."""
    members = [GroupMember(row, n, start, []) for row, (start, n) in enumerate(members)]
    parts = split_by_context(members, call_slots)
    assert sorted(m for part in parts for m in part) == members
    ends = [[m.start_pos + m.num_queries for m in part] for part in parts]
    assert all(len(e) == 1 or len(e) * max(e) <= call_slots for e in ends)
    assert all(max(a) <= min(b) for a, b in zip(ends, ends[1:]))
    if len(parts) == 1:
        assert parts[0] == members
