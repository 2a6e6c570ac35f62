"""mini_engine's server (python -m mini_engine.server) over real HTTP, on the tiny model with the
real tokenizer: one server for the file (started once, stopped at the end, nothing left on its
port), and one more for the Ctrl-C test, which stops it. What a client sees is asserted: texts,
token counts, status codes, error bodies, and /metrics read with the lab's own parser. The
incremental detokenizer is searched by hypothesis on its own."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import aiohttp
import pytest
import requests
from hypothesis import given, settings, strategies as st

from common import load, metrics, server
from lessons.task_15.servers import Settings, Started, mini_engine_command
from mini_engine.server.detokenizer import Detokenizer
from tests.helpers import processes_on_port

NAME = "tiny"
MAX_MODEL_LEN = 128
SETTINGS = Settings(max_num_seqs=64)


def start(tiny_model: str) -> Started:
    port = server.free_port()
    # torch kernels: the tiny model's step needs no C, and the server starts without timing any
    return Started("mini_engine", mini_engine_command(tiny_model, NAME, "float32", port,
                                                      SETTINGS, kernels="torch"), port,
                   timeout_s=120, progress=lambda line: None)


@pytest.fixture(scope="module")
def mini(tiny_model):
    with start(tiny_model) as srv:
        yield srv
    assert processes_on_port(srv.port) == []


def post(srv, body: dict, path: str = "/v1/completions") -> requests.Response:
    return requests.post(f"{srv.base_url}{path}", json=body, timeout=120)


def complete(srv, prompt: str, max_tokens: int, **extra) -> dict:
    resp = post(srv, {"model": NAME, "prompt": prompt, "max_tokens": max_tokens,
                      "temperature": 0, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()


def stream(srv, body: dict, path: str = "/v1/completions") -> list[dict]:
    """Every data chunk of a streamed answer, up to [DONE] (which must come)."""
    chunks = []
    with requests.post(f"{srv.base_url}{path}", json={**body, "stream": True}, stream=True,
                       timeout=120) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith(
            "text/event-stream")
        for line in resp.iter_lines():
            if line.startswith(b"data: "):
                if line == b"data: [DONE]":
                    return chunks
                chunks.append(json.loads(line[6:]))
    raise AssertionError("the stream ended without data: [DONE]")


def series(srv) -> dict[str, float]:
    return metrics.parse(metrics.fetch(srv.base_url))


def finished(srv, reason: str) -> float:
    """vllm:request_success_total{finished_reason=reason}."""
    from prometheus_client.parser import text_string_to_metric_families

    return next(sample.value for family in text_string_to_metric_families(
                    metrics.fetch(srv.base_url)) for sample in family.samples
                if sample.name == "vllm:request_success_total"
                and sample.labels["finished_reason"] == reason)


def wait_for(condition, timeout_s: float = 30):
    """condition() true, polled (the event, not a fixed wait); fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


# --- the routes ---------------------------------------------------------------------------------
def test_models_and_health(mini):
    assert requests.get(f"{mini.base_url}/health").status_code == 200
    (model,) = requests.get(f"{mini.base_url}/v1/models").json()["data"]
    assert model["id"] == NAME and model["max_model_len"] == MAX_MODEL_LEN


def test_a_streamed_answer_is_the_whole_answer_in_pieces(mini):
    """Greedy, EOS held off: the same text and token count whole and streamed; the stream's
    last chunk ends it (length), and include_usage adds a chunk of usage alone."""
    prompt = "The capital of France is"
    whole = complete(mini, prompt, 24, min_tokens=24)
    chunks = stream(mini, {"model": NAME, "prompt": prompt, "max_tokens": 24, "min_tokens": 24,
                           "temperature": 0, "stream_options": {"include_usage": True}})
    *texts, usage = chunks
    assert "".join(c["choices"][0]["text"] for c in texts) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in texts][-1] == "length"
    assert whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"]["completion_tokens"] == usage["usage"]["completion_tokens"] == 24
    assert usage["choices"] == []
    assert whole["usage"]["prompt_tokens"] == len(load_tokenizer(mini).encode(prompt))


def load_tokenizer(srv):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(srv.command[srv.command.index("--model") + 1])


def test_chat_goes_through_the_models_template(mini):
    messages = [{"role": "user", "content": "Say hi."}]
    text = load_tokenizer(mini).apply_chat_template(messages, add_generation_prompt=True,
                                                    tokenize=False)
    body = {"model": NAME, "messages": messages, "max_tokens": 8, "min_tokens": 8,
            "temperature": 0}
    whole = post(mini, body, "/v1/chat/completions").json()
    assert whole["usage"]["prompt_tokens"] == len(
        load_tokenizer(mini).encode(text, add_special_tokens=False))
    assert whole["object"] == "chat.completion" and whole["usage"]["completion_tokens"] == 8
    chunks = stream(mini, body, "/v1/chat/completions")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
        whole["choices"][0]["message"]["content"]


def test_a_stop_string_ends_the_request_where_it_occurs(mini):
    """The greedy text without a stop, then with a piece of its middle as the stop string:
    the answer is the text before it, whole and streamed, finish_reason "stop", and /metrics
    counts it as stopped; with min_tokens past it the stop string is not looked for (vLLM's
    rule), and the text is whole."""
    hold = {"ignore_eos": True}              # EOS held off, the stop strings still looked for
    full = complete(mini, "Once upon a time", 40, **hold)["choices"][0]["text"]
    stop = full[12:15]
    expected = full[:full.index(stop)]
    stopped = finished(mini, "stop")
    cut = complete(mini, "Once upon a time", 40, stop=[stop], **hold)
    assert cut["choices"][0]["text"] == expected
    assert cut["choices"][0]["finish_reason"] == "stop"
    chunks = stream(mini, {"model": NAME, "prompt": "Once upon a time", "max_tokens": 40,
                           "temperature": 0, "stop": stop, **hold})
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    wait_for(lambda: idle(mini))
    assert finished(mini, "stop") - stopped == 2
    late = complete(mini, "Once upon a time", 40, stop=[stop], min_tokens=40)
    assert late["choices"][0]["text"] == full and late["choices"][0]["finish_reason"] == "length"


# --- /metrics: vLLM's names, read by the lab's own parser ---------------------------------------
def idle(srv) -> bool:
    """No request running or waiting (a request a stop string ended is aborted a step later)."""
    snap = metrics.snapshot(metrics.fetch(srv.base_url), 0)
    return snap.running == snap.waiting == 0


def test_metrics_count_what_was_served(mini):
    wait_for(lambda: idle(mini))
    before = metrics.snapshot(metrics.fetch(mini.base_url), time.monotonic())
    old = series(mini)
    answer = complete(mini, "Count me", 6, min_tokens=6)
    text = metrics.fetch(mini.base_url)
    after = metrics.snapshot(text, time.monotonic())
    new = series(mini)
    assert after.generation_tokens - before.generation_tokens == 6
    assert new["vllm:prompt_tokens_total"] - old["vllm:prompt_tokens_total"] == \
        answer["usage"]["prompt_tokens"]
    assert after.ttft_count - before.ttft_count == 1 and after.e2e_count - before.e2e_count == 1
    assert after.itl_count - before.itl_count == 5          # the gaps between 6 tokens
    assert after.running == after.waiting == 0 and after.kv_usage == 0.0
    assert after.prefix_queries - before.prefix_queries == answer["usage"]["prompt_tokens"]
    for name, kind in (("vllm:time_to_first_token_seconds", "histogram"),
                       ("vllm:generation_tokens_total", "counter"),
                       ("vllm:num_requests_running", "gauge"),
                       ("vllm:kv_cache_usage_perc", "gauge")):
        assert f"# TYPE {name} {kind}" in text
    cache = metrics.info_labels(text, "vllm:cache_config_info")
    assert cache["block_size"] == str(SETTINGS.block_size) and int(cache["num_gpu_blocks"]) > 0


# --- many clients, clients that leave -------------------------------------------------------------
def test_64_concurrent_streams_each_get_every_token(mini):
    level = load.run_level(mini.base_url, NAME, load.user_prompts(64), 16)
    assert level.num_ok == 64, level.errors
    assert [r.output_tokens for r in level.requests] == [16] * 64
    assert all(r.text for r in level.requests)


async def leave_after_first_chunk(session, base_url: str, i: int) -> None:
    body = {"model": NAME, "prompt": f"Client {i} leaves", "max_tokens": 100,
            "min_tokens": 100, "stream": True}
    async with session.post(f"{base_url}/v1/completions", json=body) as resp:
        async for line in resp.content:
            if line.startswith(b"data:"):
                return            # the connection closes with the response, mid-stream


def test_50_clients_that_leave_mid_stream_leave_nothing_running(mini):
    async def clients():
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(leave_after_first_chunk(session, mini.base_url, i)
                                   for i in range(50)))

    aborted = finished(mini, "abort")
    asyncio.run(clients())
    wait_for(lambda: (s := metrics.snapshot(metrics.fetch(mini.base_url), 0)).running == 0
             and s.kv_usage == 0.0)
    text = metrics.fetch(mini.base_url)
    snap = metrics.snapshot(text, 0)
    assert snap.running == snap.waiting == 0 and snap.kv_usage == 0.0
    assert finished(mini, "abort") - aborted == 50


# --- bad requests: 400 (404 for a model it does not serve) and the neighbour goes on --------------
BAD = [
    ("malformed JSON", b"{not json", 400, None),
    ("prompt a number", {"model": NAME, "prompt": 5}, 400, "prompt"),
    ("prompt a list of strings", {"model": NAME, "prompt": ["a", "b"]}, 400, "prompt"),
    ("no prompt", {"model": NAME}, 400, "prompt"),
    ("empty prompt", {"model": NAME, "prompt": ""}, 400, "prompt"),
    ("a token id outside the vocabulary", {"model": NAME, "prompt": [10 ** 7]}, 400, "prompt"),
    ("unknown model", {"model": "gpt-5", "prompt": "hi"}, 404, "model"),
    ("max_tokens 0", {"model": NAME, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens a word", {"model": NAME, "prompt": "hi", "max_tokens": "ten"}, 400,
     "max_tokens"),
    ("prompt + max_tokens over max_model_len", {"model": NAME, "prompt": "hi",
                                                "max_tokens": MAX_MODEL_LEN}, 400, "max_tokens"),
    ("temperature below 0", {"model": NAME, "prompt": "hi", "temperature": -0.5}, 400,
     "temperature"),
    ("temperature above 2", {"model": NAME, "prompt": "hi", "temperature": 2.5}, 400,
     "temperature"),
    ("min_tokens over max_tokens", {"model": NAME, "prompt": "hi", "max_tokens": 4,
                                    "min_tokens": 9}, 400, "min_tokens"),
    ("n of 2", {"model": NAME, "prompt": "hi", "n": 2}, 400, "n"),
]


def test_each_bad_request_gets_its_error_and_the_neighbour_completes(mini):
    done = {}

    def neighbour():
        done["chunks"] = stream(mini, {"model": NAME, "prompt": "I keep going", "max_tokens": 60,
                                       "min_tokens": 60, "temperature": 0,
                                       "stream_options": {"include_usage": True}})

    thread = threading.Thread(target=neighbour)
    thread.start()
    wait_for(lambda: metrics.snapshot(metrics.fetch(mini.base_url), 0).running >= 1)
    for what, body, status, param in BAD:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        resp = requests.post(f"{mini.base_url}/v1/completions", data=data, timeout=30,
                             headers={"content-type": "application/json"})
        assert resp.status_code == status, what
        error = resp.json()["error"]
        assert error["code"] == status and error["message"] and error["param"] == param, what
    chat = post(mini, {"model": NAME, "messages": [{"role": "user", "content": ["a list"]}]},
                "/v1/chat/completions")
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
    thread.join(timeout=120)
    assert done["chunks"][-1]["usage"]["completion_tokens"] == 60
    assert requests.get(f"{mini.base_url}/health").status_code == 200


# --- what the server refuses to start with: one line and exit 2 ---------------------------------
@pytest.mark.parametrize("flags, message", [
    (["--model", "/nonexistent"], "is not a model folder (no config.json)"),
    (["--max-num-seqs", "0"], "EngineConfig.max_batch must be at least 1"),
    (["--kv-cache-memory-bytes", "1000"], "not one request of 128 tokens"),
    (["--port", "{busy}"], "is in use"),
])
def test_bad_settings_are_one_line_and_exit_2(tiny_model, flags, message):
    import socket
    import subprocess
    import sys

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        args = [a.replace("{busy}", port) for a in flags]
        model = [] if "--model" in args else ["--model", tiny_model]
        proc = subprocess.run([sys.executable, "-m", "mini_engine.server", *model,
                               "--kernels", "torch", *args], capture_output=True, text=True,
                              timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


# --- Ctrl-C during a load ------------------------------------------------------------------------
def test_ctrl_c_during_a_load_leaves_no_process_and_no_port(tiny_model):
    with start(tiny_model) as srv:
        pid, port = srv.proc.pid, srv.port
        results = {}
        loader = threading.Thread(target=lambda: results.update(level=load.run_level(
            srv.base_url, NAME, load.user_prompts(20), 100)))
        loader.start()
        wait_for(lambda: metrics.snapshot(metrics.fetch(srv.base_url), 0).running > 0)
        os.kill(pid, signal.SIGINT)
        assert srv.proc.wait(timeout=30) == 0          # it stopped itself, cleanly
        loader.join(timeout=60)
        srv.proc = None                                 # nothing left for Started to stop
    assert processes_on_port(port) == [] and not server.port_in_use("127.0.0.1", port)
    level = results["level"]
    assert level.num_users == 20 and level.num_ok < 20  # the load was cut, not finished
    assert any("shutting down" in e for e in level.errors), level.errors


# --- the inbox and the routes, without a model ----------------------------------------------------
def test_a_stop_in_the_inbox_ends_the_loop_and_close_answers_every_add_left():
    """The step loop reads typed messages: a Stop among them returns at once, nothing added to
    the engine; close() then ends each request still in the inbox (an Add, aborted or not)
    with the error, and refuses new ones, as Ctrl-C does to requests that came in the last
    step."""
    from types import SimpleNamespace

    from mini_engine.server.async_engine import AsyncEngine, EngineDead, Output, Request

    idle_engine = SimpleNamespace(scheduler=SimpleNamespace(has_work=False))   # no step to run
    stepper = AsyncEngine(idle_engine, metrics=None)
    loop = asyncio.new_event_loop()
    try:
        stepper.attach(loop)
        first, second = Request([1, 2], 4), Request([3], 2)
        stepper.add(first)
        stepper.add(second)
        stepper.abort(second, "stop")
        stepper.stop()
        stepper.run()                    # returns: it would have hung waiting had Stop been lost
        assert stepper.active == {} and stepper.failed is None
        stepper.close("the server is shutting down")
        loop.run_until_complete(asyncio.sleep(0))       # the one call into the event loop
        for request in (first, second):
            assert request.queue.get_nowait() == Output([], "abort", "the server is shutting down")
            assert request.queue.empty()
    finally:
        loop.close()
    assert stepper.inbox.empty()
    with pytest.raises(EngineDead, match="shutting down"):
        stepper.add(Request([4], 1))


def test_the_routes_are_the_modules_own_functions():
    """Every route is a top-level function of api.py, registered on its APIRouter: the paths
    tasks 5-8 and vllm bench serve call, and no other."""
    from mini_engine.server import api

    routes = {route.path: route.endpoint for route in api.router.routes}
    assert routes == {"/health": api.health, "/v1/models": api.models, "/metrics": api.metrics,
                      "/v1/completions": api.completions, "/v1/chat/completions": api.chat}
    assert all(endpoint.__qualname__ == endpoint.__name__ for endpoint in routes.values())


# --- the incremental detokenizer, searched --------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


# ASCII, Korean (3 bytes a syllable), emoji (4 bytes), accents: characters that take several
# byte-level tokens, so a step's tokens often end inside one
TEXT = st.text(alphabet=st.sampled_from(list("ab .,\n") + list("한국어가나") + ["😀", "🚀", "é"]),
               min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(prompt=TEXT, text=TEXT, cuts=st.lists(st.integers(1, 4), min_size=1, max_size=40))
def test_the_text_streamed_is_the_text_decoded_and_never_a_broken_character(tokenizer, prompt,
                                                                           text, cuts):
    """Any text, its tokens handed over in steps of 1 to 4: the pieces joined are the decode
    of prompt and output after the prompt's, and no piece holds U+FFFD (half a character)."""
    prompt_ids, ids = tokenizer.encode(prompt), tokenizer.encode(text)
    detok, pieces, i = Detokenizer(tokenizer, prompt_ids), [], 0
    for n in cuts * (len(ids) // len(cuts) + 1):
        if i >= len(ids):
            break
        pieces.append(detok.add(ids[i:i + n], finished=i + n >= len(ids)))
        i += n
    whole = tokenizer.decode(prompt_ids + ids)
    assert "".join(pieces) == whole[len(tokenizer.decode(prompt_ids)):]
    assert not any("\ufffd" in p for p in pieces)


@settings(max_examples=100, deadline=None)
@given(text=TEXT, data=st.data())
def test_a_stop_string_cuts_the_text_and_is_never_streamed(tokenizer, text, data):
    """A stop string drawn from the text itself: the pieces joined are the text up to its first
    occurrence, and no piece streams a character past that point."""
    ids = tokenizer.encode(text)
    decoded = tokenizer.decode(ids)
    start = data.draw(st.integers(0, len(decoded) - 1))
    stop = decoded[start:start + data.draw(st.integers(1, 4))]
    detok, pieces = Detokenizer(tokenizer, [], [stop]), []
    for i, token in enumerate(ids):
        pieces.append(detok.add([token], finished=i == len(ids) - 1))
        if detok.stopped:
            break
    assert detok.stopped
    assert "".join(pieces) == decoded[:decoded.index(stop)]
