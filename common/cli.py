"""Argument parsing for every script: bad input is one clear line and exit code 2."""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from common import report, settings


class LabArgumentParser(argparse.ArgumentParser):
    """argparse, but an error is one line (`error: ...`), not a usage block; and every script
    takes --detail (common.report.detail: what a learner does not need to follow the lesson)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument("--detail", action="store_true",
                          help="print the report in full: each pass, each request, every check")

    def parse_known_args(self, args=None, namespace=None):
        parsed, rest = super().parse_known_args(args, namespace)
        report.show_detail(parsed.detail)
        return parsed, rest

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def fail(message: str, code: int = 2) -> NoReturn:
    """Stop with one clear line on stderr and a non-zero exit code."""
    print(f"ERROR: {message}", file=sys.stderr)
    sys.exit(code)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1-65535)")
    return value


def fill_unset(args: argparse.Namespace, defaults: dict, quick: dict) -> argparse.Namespace:
    """Each flag the user left unset (None) takes its --quick value when args.quick, else its
    default: a flag given always wins (tasks 12-14)."""
    for name, value in (quick if args.quick else defaults).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def int_list(text: str) -> list[int]:
    """'45,128,23' -> [45, 128, 23]; each a whole number > 0."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or any(p == "" for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers")
    return [positive_int(p) for p in parts]


def add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", default=None,
                       help="model folder or hub id (default: LAB_MODEL, then the remembered "
                            f"choice, then {settings.HUB_MODEL_ID}, then the packaged offline model)")
    group.add_argument("--dtype", default="auto", choices=settings.DTYPE_CHOICES,
                       help="auto = bfloat16 on a CPU with native bf16, else float32")


def add_kernels_arg(parser: argparse.ArgumentParser) -> None:
    """mini_engine's EngineConfig.kernels for the tasks that measure it beside vLLM: "c" by
    default, since vLLM runs C++ kernels of its own; "torch" shows the mechanisms alone."""
    parser.add_argument("--kernels", default="c", choices=("torch", "c"),
                        help="mini_engine's step: c = mini_engine/kernels/ where they build "
                             "(default), torch = plain torch")


def resolve_model_or_fail(model_flag: str | None):
    """The model to run, or one clear line and exit 2."""
    from common.model import ModelNotFound, resolve_model

    try:
        return resolve_model(model_flag)
    except ModelNotFound as e:
        fail(str(e))


def longest_prompt_tokens(model_path: str, prompts: list[str]) -> int:
    """Tokens of the longest prompt, counted by the model's tokenizer alone (fast: no weights are
    read), so a prompt that cannot fit is refused before any model loads."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return max(len(ids) for ids in tokenizer(prompts)["input_ids"])


def check_prompt_fits(model_path: str, prompt: str, max_tokens: int,
                      max_model_len: int = settings.MAX_MODEL_LEN) -> None:
    """The prompt and its new tokens must fit max_model_len (vLLM refuses more; HuggingFace is
    held to the same, so tasks 1 and 2 run the same request), else one line and exit 2."""
    num_prompt = longest_prompt_tokens(model_path, [prompt])
    if num_prompt + max_tokens > max_model_len:
        fail(f"--prompt is {num_prompt} tokens; with --max-tokens {max_tokens} that is "
             f"{num_prompt + max_tokens}, more than max_model_len {max_model_len}: shorten it")


def add_kv_simulation_args(parser: argparse.ArgumentParser) -> None:
    """Tasks 3-4's flags; their defaults are the source's data (common.kv)."""
    from common import kv

    group = parser.add_argument_group("simulation")
    group.add_argument("--lengths", type=int_list,
                       default=[n for _, n in kv.SOURCE_REQUESTS],
                       help="tokens each request really uses (default: the source's 45,128,23,256,67)")
    group.add_argument("--max-len", type=positive_int, default=kv.MAX_LEN,
                       help=f"slots pre-allocated per request by contiguous allocation (default "
                            f"{kv.MAX_LEN})")
    group.add_argument("--total-slots", type=positive_int, default=kv.TOTAL_SLOTS,
                       help=f"token slots of memory for the concurrent-user estimate (default "
                            f"{kv.TOTAL_SLOTS})")


def check_kv_simulation_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """Lengths must fit in --max-len; returns the request names for the report."""
    from common import kv

    too_long = [n for n in args.lengths if n > args.max_len]
    if too_long:
        parser.error(f"--lengths {too_long[0]} is longer than --max-len {args.max_len}")
    return kv.request_names(args.lengths)


def add_server_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    group.add_argument("--base-url", default=None,
                       help="use this OpenAI-compatible server (e.g. vLLM on a GPU box); the lab "
                            "then never starts or stops one")
    group.add_argument("--host", default="127.0.0.1",
                       help="address the lab's server listens on (default 127.0.0.1: an "
                            "unauthenticated model server is nothing to expose)")
    group.add_argument("--port", type=port_number, default=settings.SERVER_PORT,
                       help=f"port of the lab's server (default {settings.SERVER_PORT})")


def lab_server(base_url: str | None, model_flag: str | None, dtype_flag: str = "auto", *,
               host: str = "127.0.0.1", port: int = settings.SERVER_PORT,
               max_num_seqs: int = 256, max_model_len: int = settings.MAX_MODEL_LEN):
    """(server, model, dtype) from a script's server flags: the --base-url server, or the lab's
    server (common.server.lab_server) for --model and --dtype with these settings, its progress
    lines printed in the report; a model that cannot be found is one line and exit 2. model and
    dtype are None for an external server."""
    from common import report, server

    if base_url:
        return server.lab_server(base_url=base_url), None, None
    model = resolve_model_or_fail(model_flag)
    dtype = settings.resolve_dtype(dtype_flag)
    srv = server.lab_server(model=model, dtype=dtype.dtype, host=host, port=port,
                            max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                            progress=lambda line: report.note(line, indent=2))
    return srv, model, dtype


def fail_if_any_failed(failed: int | list[str]) -> None:
    """Exit 1 when any request (a count) or run (its names) failed: the report above counts
    them; the exit code tells a script or CI (tasks 6 and 7, benchmarks/server_configs.py)."""
    if failed:
        what = f"{failed} request(s)" if isinstance(failed, int) else ", ".join(failed)
        fail(f"{what} failed (see the report above)", code=1)


def run(main) -> None:
    """Run a script's main(): a server failure or Ctrl-C ends in one clear line, not a traceback.
    SIGTERM (a test harness, `kill`) is taken as Ctrl-C, so a server this run started is stopped
    on the way out either way."""
    import signal

    from common.server import ServerError

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        main(sys.argv[1:])
    except ServerError as e:
        fail(str(e), code=1)
    except OSError as e:   # e.g. a host name that does not resolve, a port taken meanwhile
        fail(f"{type(e).__name__}: {e}", code=1)
    except KeyboardInterrupt:
        fail("interrupted (any server this run was starting has been stopped)", code=130)


def add_sampling_args(parser: argparse.ArgumentParser, prompt: str = settings.PROMPT) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument("--prompt", default=prompt, help=f'the prompt (default: "{prompt}")')
    group.add_argument("--max-tokens", type=positive_int, default=settings.MAX_NEW_TOKENS,
                       help=f"new tokens to generate (default {settings.MAX_NEW_TOKENS})")
