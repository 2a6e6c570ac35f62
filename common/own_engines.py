"""What every step that runs engines of its own (tasks 9-14) sets up before it measures, written
once: the model and dtype its flags chose, torch on the lab's threads, the model's tokenizer and
end-of-sequence ids, a progress clock, and the header its record is saved with."""
from __future__ import annotations

import argparse
from typing import Any, Callable, NamedTuple

from common import cli, measure, results, settings


class Start(NamedTuple):
    """What a step unpacks: `model_choice, dtype, tokenizer, eos_ids, progress, header =
    own_engines.start(args)`."""
    model: Any                        # common.model.ModelChoice: what ran, and from where
    dtype: settings.DtypeChoice
    tokenizer: Any                    # the model's own (transformers)
    eos_ids: list[int]                # every token id that ends an answer
    progress: Callable[[str], None]   # a line a part, with the time since the start
    header: results.RunHeader         # model, dtype, threads: what the record says ran


def start(args: argparse.Namespace) -> Start:
    """The model (--model, else the lab's choice) and dtype (--dtype) or one clear line and exit
    2; torch on settings.num_cores() threads; the tokenizer and EOS ids of the model."""
    model = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)
    import torch
    from transformers import AutoTokenizer

    from mini_engine.engine import eos_token_ids

    torch.set_num_threads(settings.num_cores())
    return Start(model, dtype, AutoTokenizer.from_pretrained(model.path),
                 eos_token_ids(model.path), measure.progress_clock(),
                 results.RunHeader.of(model, dtype, torch.get_num_threads()))
