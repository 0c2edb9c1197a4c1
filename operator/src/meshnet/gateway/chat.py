"""Chat messages -> the prompt text, with the model's own chat template (the GGUF's
tokenizer.chat_template, which every stage reports in GetInfo).

The template comes from a model file, so it runs in Jinja's sandbox: it can format the
messages and nothing else.

Only the template's own markers become special tokens: where each message's content lies in
the prompt is found (`ChatPrompt.literal`), and the stage tokenizes those bytes without
making a control token of them, so a user who types "<|im_end|>\n<|im_start|>system" sends
text, not a system turn.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ChatPrompt:
    text: str
    literal: tuple[tuple[int, int], ...]  # UTF-8 byte ranges of message content in `text`
    unplaced: tuple[int, ...]  # messages whose content the template changed: not located


def chat_prompt(template: str, messages: Sequence[Mapping[str, Any]]) -> ChatPrompt:
    """The prompt and where each message's content lies in it. The template is rendered a
    second time with a unique mark in place of each content; when the marks, put back,
    give the prompt, they say where the contents are. Otherwise (a template that trims or
    cuts content) each content is looked for in order; one not found is `unplaced`."""
    text = render_chat(template, messages)
    nonce = secrets.token_hex(8)
    marks = [f"\ue000{nonce}:{i}\ue001" for i in range(len(messages))]
    contents = [str(m.get("content", "")) for m in messages]
    try:
        skeleton = render_chat(
            template, [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)])
    except ChatTemplateError:  # a template that looks into the content: find it instead
        return _searched(text, contents)
    pieces = re.split(f"\ue000{nonce}:(\\d+)\ue001", skeleton)
    rebuilt, offset, spans = [pieces[0]], len(pieces[0].encode()), []
    for index, after in zip(pieces[1::2], pieces[2::2], strict=True):
        content = contents[int(index)]
        size = len(content.encode())
        if size:
            spans.append((offset, offset + size))
        rebuilt += [content, after]
        offset += size + len(after.encode())
    if "".join(rebuilt) == text:
        return ChatPrompt(text, tuple(spans), ())
    return _searched(text, contents)


def _searched(text: str, contents: Sequence[str]) -> ChatPrompt:
    """Each content (or, for a template that trims it, its stripped text) in order."""
    spans, unplaced, cursor = [], [], 0
    for index, content in enumerate(contents):
        if not content.strip():
            continue
        found, piece = next(((at, piece) for piece in (content, content.strip())
                             if (at := text.find(piece, cursor)) >= 0), (-1, content))
        if found < 0:
            unplaced.append(index)
            continue
        start = len(text[:found].encode())
        spans.append((start, start + len(piece.encode())))
        cursor = found + len(piece)
    return ChatPrompt(text, tuple(spans), tuple(unplaced))


def chat_tokens(prompt: ChatPrompt, contents: Sequence[str],
                tokenize: Callable[[str, Sequence[tuple[int, int]]], list[int]]) -> list[int]:
    """The prompt's tokens, content kept literal. A content the template changed so that
    it cannot be located is served only when it spells no special token (its tokens are
    the same with and without literal parsing); else the request is refused."""
    for index in prompt.unplaced:
        content = contents[index]
        if tokenize(content, ((0, len(content.encode())),)) != tokenize(content, ()):
            raise ChatTemplateError(
                f"messages[{index}].content spells special tokens of the model, and the chat "
                "template changes message text, so it cannot be kept apart from the "
                "template's own markers: remove the special-token text")
    return tokenize(prompt.text, prompt.literal)


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
