"""The fixtures and pytest's hooks: the results and the servers' state kept in temporary folders,
a tiny model the tests build themselves, the real-model run of the whole lab (lab_run,
whole_lab), a tiny-model server that speculates (speculating_server), and which worker runs what
(pytest_collection_modifyitems). The helpers they stand on, and the tests too: tests/helpers.py.
Records built by hand: tests/hand/."""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from tests.helpers import (LAB_GROUP, SMALL_VOCAB, SPECULATING, LabParts, LabRun, file_group,
                           lab_parts, name_its_group, part_of, processes_on_port,
                           save_tiny_llama)


@pytest.fixture(autouse=True)
def _results_in_tmp(tmp_path, monkeypatch):
    """No test writes into the learner's results/ folder."""
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path / "results"))


@pytest.fixture(autouse=True, scope="session")
def _server_state_in_tmp(tmp_path_factory):
    """The servers the tests start keep their state and log (server-<port>.json/.log) in a folder
    of the test session, never in .cache/ beside a learner's running lab. One folder for the
    session, so a server one test starts, the next can reuse."""
    old = os.environ.get("LAB_SERVER_DIR")
    os.environ["LAB_SERVER_DIR"] = str(tmp_path_factory.mktemp("servers"))
    yield
    if old is None:
        os.environ.pop("LAB_SERVER_DIR", None)
    else:
        os.environ["LAB_SERVER_DIR"] = old


@pytest.fixture(scope="session")
def real_model():
    """The lab's own model choice (the packaged offline model on a machine with no hub)."""
    from common.model import resolve_model

    return resolve_model()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, real_model) -> str:
    """A 2-layer Llama with random weights and the real tokenizer: the real code paths of
    transformers and vLLM in a few seconds. head_dim 64 is one the vLLM CPU attention supports."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(real_model.path)
    save_tiny_llama(out, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def model_args(tiny_model) -> list[str]:
    """A script's flags for the tiny model in fp32: what tasks 3-4 read of a model."""
    return ["--model", tiny_model, "--dtype", "float32"]


# --- the engine tests' model: tiny_model's shape with a small vocabulary -----------------------
@pytest.fixture(scope="session")
def small_vocab_model(tmp_path_factory) -> str:
    """tiny_model's shape (2 layers, random weights, tied embeddings) with a vocabulary of 1,024
    instead of 49,152, and no tokenizer: for the tests that drive mini_engine with token ids. The
    LM head over 49,152 rows is most of a step of tiny_model (5.2 ms a step, 0.72 ms with 1,024
    rows, measured), so the engine tests search as many cases in a fraction of the time. A test
    that needs the real tokenizer keeps tiny_model. A real HF folder: transformers loads it."""
    out = tmp_path_factory.mktemp("small-vocab-llama")
    save_tiny_llama(out, SMALL_VOCAB, bos_token_id=1, eos_token_id=2)
    return str(out)


@pytest.fixture(scope="session")
def tiny_llama(small_vocab_model):
    """mini_engine's Llama (fp32) on small_vocab_model, one for the session: shared by every
    engine test, which is safe as each LLMEngine allocates its own KV pool (the model holds
    none) and no test changes the model (a test that needs other weights builds its own)."""
    from mini_engine import Llama

    return Llama(small_vocab_model)


# --- the whole lab on the real model, run once, in two parts (tests/helpers.py: LabParts) ---------
@pytest.fixture(scope="session")
def _lab_parts(tmp_path_factory) -> Iterator[LabParts]:
    # one folder for the whole pytest run: the workers' own (popen-gw0, ...) share a parent
    base = tmp_path_factory.getbasetemp()
    parts = LabParts(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
    try:
        yield parts
    finally:
        parts.stop()


@pytest.fixture
def lab_run(request, _lab_parts) -> LabRun:
    """The part of the real-model lab that ran the steps this test checks, as its mark names
    them (@pytest.mark.lab_steps("task_9_build_your_own_engine")): run once for every test that
    asks for it, each in the test file of what it checks (test_task_9.py holds task 9's). A
    server it left is stopped at the end, whatever happened (test_the_lab_leaves_no_process_on_
    its_ports checks that the lab left none). pytest_collection_modifyitems marks these
    real_model and puts each part's in one group, first."""
    return _lab_parts.get(part_of(request.node.get_closest_marker("lab_steps").args))


@pytest.fixture
def whole_lab(_lab_parts) -> list[LabRun]:
    """Every part of the real-model lab, in the order of the steps: for the lab-wide checks
    (tests/lab/test_lab.py), which run last."""
    return [_lab_parts.get(i) for i in range(len(lab_parts()))]


# --- a tiny-model server the --base-url tests share ---------------------------------------------
@pytest.fixture(scope="session")
def speculating_server(tiny_model, _server_state_in_tmp):
    """A tiny-model server on a free port, speculating with vLLM's ngram at k = 3, started once
    for the tests that use a server given by --base-url (tasks 11 and 12: each marks itself
    xdist_group("speculating_server"), so both run on the worker that started it); stopped at
    the end of the session, and nothing left on its port. Yields its ServerConfig."""
    from common import server

    port = server.free_port()
    config = server.ServerConfig(tiny_model, "tiny", "float32", max_model_len=256,
                                 max_num_seqs=16, port=port,
                                 engine_args=("--speculative-config", SPECULATING))
    try:
        server.ensure_server(config)
        yield config
    finally:
        server.stop_server(port)
    assert processes_on_port(port) == []


def pytest_configure(config):
    """With pytest -n N (pytest-xdist; pytest.ini asks for 2), each worker and every process it
    starts get their own share of the cores, as on a smaller machine: two workers sharing both
    cores ran the suite slower than one core each (two OpenMP thread pools on the same cores is
    the likely cause, not measured; the figures are in docs/measurements.md)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")              # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0))
    if worker and len(cores) >= count:
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw"))::count])
    # A background job of a non-interactive shell starts with SIGINT ignored and hands that to
    # every child, so the Ctrl-C tests' scripts would never see their Ctrl-C. A handler here (a
    # handler, unlike an ignore, is not inherited across exec) gives each child the default.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Which worker runs what, under pytest.ini's --dist loadgroup (xdist deals out whole
    xdist_group's, in this order, the next to the first worker with two tests or fewer left):
    - each part of the lab's run (lab_parts) is one group, the checks of its steps (the tests
      that take lab_run, in whichever file, marked lab_steps), marked real_model and engine;
      the two go first, so each worker starts on one: they are the longest by far;
    - the lab-wide checks (those that take whole_lab) are one group, last: by then both parts
      are done, so no worker waits for the other;
    - every other test without a group of its own is grouped by its file, so a file's tests
      share a worker and its module-scoped server, as --dist loadfile had them.
    tryfirst: before xdist's own hook, which reads the xdist_group marks (xdist/remote.py), and
    before -m reads real_model."""
    rank = {}
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "lab_run" in fixtures or "whole_lab" in fixtures:
            item.add_marker(pytest.mark.real_model)
            item.add_marker(pytest.mark.engine)
            group, rank[id(item)] = LAB_GROUP, 2
            if "lab_run" in fixtures:
                mark = item.get_closest_marker("lab_steps")
                if mark is None:
                    raise pytest.UsageError(f"{item.nodeid} takes lab_run: name the steps it "
                                            f"checks, @pytest.mark.lab_steps(...)")
                part = part_of(mark.args)
                group, rank[id(item)] = f"lab_part_{part}", part / 10
            item.add_marker(pytest.mark.xdist_group(group))
        elif item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(file_group(item)))
        if getattr(config.option, "loadgroup", False):       # on an xdist worker
            name_its_group(item)
    items.sort(key=lambda item: rank.get(id(item), 1))   # stable: files keep their order

