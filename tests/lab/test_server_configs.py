"""benchmarks/server_configs.py: a tiny subset of its configurations on the tiny model, on free
ports (never :8000); a configuration whose library is missing is skipped with how to get it;
bad input is one line."""
from __future__ import annotations

import pytest

from benchmarks import server_configs
from common import results
from common.load import LoadLevel
from tests.helpers import assert_fits, processes_on_port, run_script, saved_result


@pytest.mark.engine
def test_a_configuration_on_the_tiny_model(tiny_model):
    """One server (a start takes ~30 s here, whatever the model): the lab's settings with
    --block-size 16; the full set runs as `make bench-server`."""
    proc = run_script("benchmarks/server_configs.py", "--model", tiny_model, "--dtype", "float32",
                      "--configs", "block-16", "--users", "1,3", "--max-tokens", "8",
                      timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    r = saved_result("server_configs")
    assert [c["name"] for c in r["configs"]] == ["block-16"]
    for c in r["configs"]:
        assert c["status"] == "ok" and c["startup_s"] > 0
        assert 0 < c["idle_pss_bytes"] <= c["peak_pss_bytes"]
        # the worker in the engine core: API server, engine core, resource tracker
        assert c["num_processes"] == 3
        assert [lv["num_output_tokens"] for lv in c["levels"]] == [8, 24]
        assert [lv["num_users"] for lv in c["levels"]] == [1, 3]
        assert all(lv["num_ok"] == lv["num_users"] and lv["errors"] == []
                   and lv["mean_tpot_s"] > 0 for lv in c["levels"])
    # the block size the server ran with, as its engine reports it on /metrics
    assert r["configs"][0]["kv_block_size_tokens"] == 16
    assert "SERVER CONFIGURATIONS" in proc.stdout
    assert "Best server at 3 users: block-16" in proc.stdout
    assert_fits(proc.stdout)
    ports = [int(line.split(":")[2].split()[0].rstrip(".")) for line in proc.stdout.splitlines()
             if "Starting vLLM server on http" in line]
    assert len(ports) == 1 and processes_on_port(ports[0]) == []     # started once, then stopped


def test_a_configuration_without_its_library_is_skipped_with_how_to_get_it(tiny_model,
                                                                           monkeypatch, capsys):
    monkeypatch.setattr(server_configs, "library_path", lambda name: None)
    record = server_configs.main(["--model", tiny_model, "--configs", "preload"])
    (row,) = record.configs
    assert row.status == "skipped" and row.startup_s is None
    assert "apt-get install libtcmalloc-minimal4" in row.note
    assert "pip install intel-openmp" in row.note
    # saved whole, and read back the same
    assert results.load("server_configs", server_configs.ServerConfigs).configs == [row]
    assert "preload: skipped, not found: libtcmalloc_minimal.so.4" in \
        " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("args, message", [
    (["--configs", "in-process,fast"], "unknown configuration 'fast'"),
    (["--users", "1,0"], "'0' must be greater than 0"),
    (["--max-tokens", "x"], "'x' is not a whole number"),
    (["--users", "1,5,10,20"], "--users: 4 levels do not fit the 65-column table; give at most 3"),
])
def test_bad_input_is_one_line(args, message):
    proc = run_script("benchmarks/server_configs.py", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def row(name: str, tok_s_at_20: float, ttft_s: float = 1.0, latency_s: float = 14.0):
    # 20 users of 50 tokens each; the duration gives the level its tok/s
    return server_configs.ConfigResult(name, "", "ok", levels=[
        LoadLevel(20, 20, 1000 / tok_s_at_20, 1000, tok_s_at_20, mean_ttft_s=ttft_s,
                  mean_latency_s=latency_s, mean_tpot_s=0.26)])


def test_findings_are_chosen_from_the_figures():
    rows = [row("multiproc", 54.4), row("in-process", 72.4), row("block-16", 71.4),
            row("block-128", 65.0), row("preload", 85.0, ttft_s=10.4, latency_s=11.7),
            row("offline", 72.4, ttft_s=0, latency_s=0)]
    lines = server_configs.findings(rows, top_users=20)
    assert lines[0] == "Best server at 20 users: preload, 85.0 tok/s; within 10% (the noise) " \
                       "of it: none"
    assert lines[1] == "Block size 16 vs 128 at 20 users: 71.4 vs 65.0 tok/s (110%), within " \
                       "the 10% noise"
    assert lines[2].startswith("preload: at 20 users the first token came after 10.4 s of 11.7 s")
    assert lines[3] == "The lab's server vs the offline engine at 20 users: 72.4 vs 72.4 tok/s " \
                       "= 1.00x"
    slower = server_configs.findings([row("block-16", 50.0), row("block-128", 65.0)], 20)
    assert slower[1].endswith("(77%), slower, beyond the 10% noise")
    assert "within 10% (the noise) of it: block-16" in \
        server_configs.findings([row("block-16", 60.0), row("block-128", 65.0)], 20)[0]
