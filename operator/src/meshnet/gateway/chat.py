"""Chat messages -> the prompt text, with the model's own chat template (the GGUF's
tokenizer.chat_template, which every stage reports in GetInfo).

The template comes from a model file, so it runs in Jinja's sandbox: it can format the
messages and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, NoReturn

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from meshnet.errors import MeshnetError

# Models whose GGUF carries no template get ChatML, as llama.cpp's server falls back to.
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatTemplateError(MeshnetError):
    """The model's chat template failed on these messages."""


def _raise(message: str) -> NoReturn:
    raise ChatTemplateError(f"the model's chat template refused the messages: {message}")


@lru_cache(maxsize=8)
def _compiled(source: str) -> Any:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now(UTC).strftime(fmt)
    return env.from_string(source)


def render_chat(template: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """The prompt for `messages`, ending where the assistant's answer begins. BOS and EOS
    are left to the tokenizer (it adds what the vocabulary says), so the template gets
    them empty."""
    try:
        return str(_compiled(template or CHATML).render(
            messages=list(messages), add_generation_prompt=True, bos_token="", eos_token="",
            tools=None))
    except ChatTemplateError:
        raise
    except TemplateError as exc:
        raise ChatTemplateError(f"the model's chat template cannot be rendered: {exc}") from exc
