"""mini_engine's compiled forward (task 13, EngineConfig.kernels "compiled",
mini_engine/kernels/compiled.py): the same tokens as the eager engine with the same kernels
("c") on every path a step takes, the graph calling the engine's product, every graph made at the
warm-up and none in a step, and the cases it refuses. torch keeps the graphs for the process, so
this file compiles once (the first warm-up) and every later engine reuses them;
test_engine_properties.py draws kernels "compiled" as one more setting of its searches on the
same terms."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from mini_engine import EngineConfig, LLMEngine, Llama
from mini_engine.kernels import compiled as compiled_mod
from mini_engine.model import RequestChunk

MAX_MODEL_LEN = 40

# (name, EngineConfig settings, workload): the paths of tasks 9-12, each with a pool, a budget or
# a k that makes it happen (the asserts below check that it did)
PATHS = {
    "preemption": dict(num_pages=10, page_size=4, max_batch=4),
    "chunks": dict(num_pages=40, page_size=4, max_batch=3, max_num_batched_tokens=7),
    "static batching": dict(num_pages=40, page_size=4, max_batch=3, policy="static"),
    "prefix hits": dict(num_pages=40, page_size=4, max_batch=2, enable_prefix_caching=True),
    "guesses": dict(num_pages=40, page_size=4, max_batch=3, num_speculative_tokens=3),
}
SHARED = [7, 8, 9, 10, 11, 12, 13, 14]           # a system prompt of two pages of 4
WORKLOAD = [(SHARED + [20, 21, 22], 12), (SHARED + [30], 9), ([5, 6, 5, 6, 5, 6, 5], 14),
            (SHARED + [40, 41, 42, 43, 44, 45, 46, 47, 48], 6), ([99], 16)]


def run(model: Llama, kernels: str, settings: dict) -> tuple[LLMEngine, list[list[int]]]:
    """The workload through an engine with these kernels ("c": eager; "compiled")."""
    settings = dict(settings)
    num_pages, page_size = settings.pop("num_pages"), settings["page_size"]
    eng = LLMEngine(model, [], EngineConfig(
        kv_bytes=num_pages * page_size * model.kv_bytes_per_token, max_model_len=MAX_MODEL_LEN,
        kernels=kernels, **settings))
    eng.warm_up()
    seqs = [eng.add_request(prompt, n) for prompt, n in WORKLOAD]
    eng.run()
    return eng, [s.output_ids for s in seqs]


@pytest.fixture(scope="module")
def warmed(tiny_llama):
    """One compiled engine warmed up: the process's compile, measured once."""
    eng = LLMEngine(tiny_llama, [], EngineConfig(kv_bytes=64 * 16 * tiny_llama.kv_bytes_per_token,
                                                 kernels="compiled"))
    return eng, eng.warm_up()


def test_the_warm_up_makes_every_graph_and_a_step_makes_none(warmed, tiny_llama):
    eng, warm = warmed
    # one graph for every step (one row runs as two); none if another test of this process
    # compiled it first (the graphs are the process's)
    assert warm.graphs in (1, 0) and compiled_mod.num_graphs() >= 1     # compiled, not eager
    before = compiled_mod.num_graphs()
    one_row = []
    for name, settings in PATHS.items():
        eng, _ = run(tiny_llama, "compiled", settings)
        one_row += [st.num_rows == 1 for st in eng.steps]
    assert compiled_mod.num_graphs() == before, "a step compiled a graph after the warm-up"
    assert any(one_row) and not all(one_row)   # steps of one row (run as two) and of more


@pytest.mark.parametrize("path", PATHS)
def test_the_compiled_engine_gives_the_eager_engines_tokens(warmed, tiny_llama, path):
    eager, tokens = run(tiny_llama, "c", PATHS[path])
    comp, compiled_tokens = run(tiny_llama, "compiled", PATHS[path])
    assert compiled_tokens == tokens
    assert [len(t) for t in tokens] == [n for _, n in WORKLOAD]        # EOS never ends them
    # the path was taken, in both engines alike
    assert TOOK[path](eager) and TOOK[path](comp)
    assert [st.num_rows for st in comp.steps] == [st.num_rows for st in eager.steps]


# what shows that a run took its path: a prompt computed in chunks is a row of a step that made
# no token (num_output_tokens 0) and was not padding
TOOK = {"preemption": lambda e: e.scheduler.num_preemptions > 0,
        "chunks": lambda e: any(n == 0 for st in e.steps
                                for i, n in zip(st.seq_ids, st.num_output_tokens)
                                if i not in st.padding_ids),
        "static batching": lambda e: any(st.num_rows > st.num_live for st in e.steps),
        "prefix hits": lambda e: e.block_manager.num_hit_tokens > 0,
        "guesses": lambda e: sum(st.num_accepted_tokens for st in e.steps) > 0}


def test_a_step_before_the_warm_up_is_refused(warmed, tiny_llama):
    eng = LLMEngine(tiny_llama, [], EngineConfig(kv_bytes=64 * 16 * tiny_llama.kv_bytes_per_token,
                                                 kernels="compiled"))
    eng.add_request([1, 2, 3], 2)
    with pytest.raises(RuntimeError, match="warm_up"):
        eng.step()


@pytest.mark.parametrize("kernels", ["torch", "c"])
def test_the_eager_engine_has_nothing_to_warm(tiny_llama, kernels):
    eng = LLMEngine(tiny_llama, [], EngineConfig(kv_bytes=64 * 16 * tiny_llama.kv_bytes_per_token,
                                                 kernels=kernels))
    assert eng.warm_up() is None and eng.compiled is None
    assert eng.forward == tiny_llama.forward and eng.kernels_used()["forward"] == "eager"


def test_the_graph_calls_the_engines_product(small_vocab_model, warmed):
    """The graph calls the step's product (a custom op that reads it from the forward's context),
    so a compiled engine keeps the product kernels "c" chose: on a model of its own (a graph of
    its own number) it gives the eager engine's tokens, with the same Products. And a forward
    handed a product of its own calls it for every weight, 4 a layer and the LM head, with the
    eager forward's logits through the same product."""
    model = Llama(small_vocab_model)
    eager, tokens = run(model, "c", PATHS["chunks"])
    eng, compiled_tokens = run(model, "compiled", PATHS["chunks"])
    assert compiled_tokens == tokens and eng.compiled.number != warmed[0].compiled.number
    assert eng.products is eager.products and eng.linear is eager.linear
    assert eng.kernels_used() == eager.kernels_used() | {"forward": "compiled"}
    calls = []

    def counted(x, weight):
        calls.append(tuple(weight.shape))
        return F.linear(x, weight)

    chunks = [RequestChunk([5, 6, 7, 8, 9], 0, [0, 1])]
    logits = {}
    for name, forward in (("compiled", eng.compiled.forward), ("eager", model.forward)):
        pools = eng.allocate_kv_cache(3)
        with torch.inference_mode():
            logits[name] = forward(eng.batch_of(chunks), pools, None, counted)
        if name == "compiled":
            assert len(calls) == 4 * model.num_layers + 1
            assert calls[-1] == tuple(model.lm_head.shape)
    assert len(calls) == 2 * (4 * model.num_layers + 1)
    assert torch.allclose(logits["compiled"], logits["eager"], rtol=1e-4, atol=1e-4)


def test_refused_in_one_line_where_torch_compile_is_off(tiny_llama, monkeypatch):
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    with pytest.raises(RuntimeError, match="TORCHDYNAMO_DISABLE"):
        LLMEngine(tiny_llama, [], EngineConfig(kv_bytes=64 * 16 * tiny_llama.kv_bytes_per_token,
                                               kernels="compiled"))


def test_refused_in_one_line_without_a_cpp_compiler(tiny_llama, monkeypatch):
    # compiled.py's own shutil only: kernels/build.py's C compiler is not the one missing
    monkeypatch.setattr(compiled_mod, "shutil", SimpleNamespace(which=lambda name: None))
    with pytest.raises(RuntimeError, match="C\\+\\+ compiler"):
        LLMEngine(tiny_llama, [], EngineConfig(kv_bytes=64 * 16 * tiny_llama.kv_bytes_per_token,
                                               kernels="compiled"))


@pytest.mark.parametrize("kernels, message", [
    (1, "EngineConfig.kernels must be str, not 1"),
    ("inductor", "EngineConfig.kernels 'inductor' is not one of torch, c, compiled"),
])
def test_kernels_must_be_one_of_the_three(kernels, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(kv_bytes=1 << 20, kernels=kernels)

