"""The gateway's pure parts alone: request bodies to jobs (or the 400 they deserve), and
the streamed text with stop strings held back until they can no longer match."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from meshnet.gateway.chat import ChatTemplateError, chat_prompt, chat_tokens
from meshnet.gateway.limits import RouteBounds
from meshnet.gateway.requests import BadRequest, chat_job, completion_job
from meshnet.gateway.text import TextStream

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ROUTE = RouteBounds(n_ctx=2048, n_vocab=49152)
SMALL = RouteBounds(n_ctx=64, n_vocab=49152)


def test_a_chat_body_becomes_a_job_with_its_sampling_and_stream_options() -> None:
    job = chat_job({**CHAT, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 7,
                    "max_completion_tokens": 12, "stop": "END", "stream": True,
                    "stream_options": {"include_usage": True}}, ROUTE)
    assert (job.kind, job.model, job.max_tokens, job.stop) == ("chat", "m", 12, ("END",))
    assert (job.sampling.temperature, job.sampling.top_p, job.sampling.top_k,
            job.sampling.seed) == (0.5, 0.9, 40, 7)
    assert job.stream and job.include_usage and not job.ignore_eos
    parts = chat_job({**CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}, ROUTE)
    assert parts.messages[0]["content"] == "ab"
    assert chat_job(CHAT, ROUTE, default_seed=99).sampling.seed == 99


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": CHAT["messages"]}, "model"),
    ({**CHAT, "messages": []}, "messages"),
    ({**CHAT, "messages": [{"content": "no role"}]}, "messages"),
    ({**CHAT, "n": 2}, "n"),
    ({**CHAT, "temperature": 3}, "temperature"),
    ({**CHAT, "max_tokens": 4096}, "max_tokens"),
    ({**CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
    ({**CHAT, "logprobs": True}, "logprobs"),
    ({**CHAT, "frequency_penalty": 0.5}, "frequency_penalty"),
    ({**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
])
def test_what_cannot_be_served_as_asked_is_refused_naming_the_field(
        body: dict[str, object], param: str) -> None:
    with pytest.raises(BadRequest) as refused:
        chat_job(body, ROUTE)
    assert refused.value.param == param


def test_a_completion_takes_text_or_token_ids() -> None:
    assert completion_job({"model": "m", "prompt": "x"}, SMALL).prompt == "x"
    assert completion_job({"model": "m", "prompt": ["x"]}, SMALL).prompt == "x"
    assert completion_job({"model": "m", "prompt": [1, 2, 3]}, SMALL).prompt == (1, 2, 3)
    for bad in ("", [], [True], None, ["x", "y"]):
        with pytest.raises(BadRequest):
            completion_job({"model": "m", "prompt": bad}, SMALL)


def test_a_stop_string_cut_between_tokens_is_never_shown() -> None:
    stream = TextStream(("STOP",))
    shown = [stream.update(t) for t in ("Hello S", "Hello ST", "Hello STO", "Hello STOP!")]
    assert "".join(shown) == "Hello " and stream.stopped
    assert stream.update("Hello STOP! more", final=True) == ""


def test_a_held_back_prefix_is_shown_once_it_cannot_become_a_stop_string() -> None:
    stream = TextStream(("STOP",))
    assert stream.update("a ST") == "a "
    assert stream.update("a STAR") == "STAR"
    assert stream.update("a STAR S", final=True) == " S"
    assert not stream.stopped and stream.shown == "a STAR S"


def test_each_messages_content_is_located_in_the_prompt_as_utf8_byte_ranges() -> None:
    messages = [{"role": "system", "content": "Sé brief."},
                {"role": "user", "content": "x<|im_end|>"}, {"role": "user", "content": ""}]
    prompt = chat_prompt("", messages)  # ChatML
    located = [prompt.text.encode()[b:e].decode() for b, e in prompt.literal]
    assert located == ["Sé brief.", "x<|im_end|>"] and prompt.unplaced == ()


def test_a_template_that_trims_content_is_located_by_search_and_a_changed_one_is_not() -> None:
    trims = "{% for m in messages %}<|u|>{{ m['content'] | trim }}{% endfor %}"
    prompt = chat_prompt(trims, [{"role": "user", "content": "  hello  "}])
    assert [prompt.text.encode()[b:e].decode() for b, e in prompt.literal] == ["hello"]
    cuts = "{% for m in messages %}<|u|>{{ m['content'].split('</think>')[-1] }}{% endfor %}"
    prompt = chat_prompt(cuts, [{"role": "assistant", "content": "a</think>b<|u|>"}])
    assert prompt.unplaced == (0,)


def test_content_the_template_changed_is_served_only_when_it_spells_no_special_token() -> None:
    def tokenize(text: str, literal: Sequence[tuple[int, int]]) -> list[int]:
        # a stand-in tokenizer: "<s>" is special unless it lies in a literal range
        special = [] if literal else [i for i in range(len(text)) if text.startswith("<s>", i)]
        return [len(text), *special]

    cuts = "{% for m in messages %}{{ m['content'].split('|')[-1] }}{% endfor %}"
    harmless = chat_prompt(cuts, [{"role": "user", "content": "a|b"}])
    assert chat_tokens(harmless, ["a|b"], tokenize) == tokenize("b", ())
    spelled = chat_prompt(cuts, [{"role": "user", "content": "a|b<s>"}])
    with pytest.raises(ChatTemplateError, match="spells special tokens"):
        chat_tokens(spelled, ["a|b<s>"], tokenize)


def test_a_template_that_refuses_the_marks_still_gets_its_content_located() -> None:
    picky = ("{% for m in messages %}{% if not m['content'].startswith('Q:') %}"
             "{{ raise_exception('questions only') }}{% endif %}<|u|>{{ m['content'] }}"
             "{% endfor %}")
    prompt = chat_prompt(picky, [{"role": "user", "content": "Q: <|u|>why?"}])
    assert [prompt.text.encode()[b:e].decode() for b, e in prompt.literal] == ["Q: <|u|>why?"]
