"""Real text the machine already has, and chat prompts, for the tasks whose workloads need more
than the lab's short questions: task 11 cuts long documents from it, task 12 asks the model to
copy windows of it. The GPL-3 from /usr/share/common-licenses (Debian and Ubuntu ship it), else
Python's own LICENSE.txt (every CPython has it)."""
from __future__ import annotations

import sysconfig
from pathlib import Path

from common import cli

GPL_3 = Path("/usr/share/common-licenses/GPL-3")       # Debian and Ubuntu ship it
PYTHON_LICENSE = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"   # every CPython has it


def source_text(what: str = "the texts") -> tuple[Path, str, str | None]:
    """(path, text with its whitespace squeezed, a note when it is not the GPL-3): the GPL-3,
    else Python's own LICENSE.txt; neither is one line and exit 2. what: what is cut from it,
    for the note and the error ("the long documents")."""
    for path, note in ((GPL_3, None), (PYTHON_LICENSE, f"{GPL_3} not found: {what} are cut "
                                                       f"from {PYTHON_LICENSE} instead")):
        if path.is_file():
            return path, " ".join(path.read_text(errors="replace").split()), note
    cli.fail(f"no text to cut {what} from: neither {GPL_3} nor {PYTHON_LICENSE} exists")


def templated(tokenizer, question: str) -> str:
    """One user turn through the model's chat template, ready for the assistant's answer."""
    return tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True, tokenize=False)
