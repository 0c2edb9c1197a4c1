"""Prompt-lookup drafts and the adaptive draft length (meshnet.route.drafts, pure)."""

from __future__ import annotations

import pytest

from meshnet.route.drafts import MAX_DRAFT, DraftLength, PromptLookup


def lookup(tokens: list[int], max_ngram: int = 3) -> PromptLookup:
    index = PromptLookup(max_ngram=max_ngram)
    index.extend(tokens)
    return index


def test_the_longest_earlier_match_of_the_suffix_proposes_what_followed_it() -> None:
    #            0  1  2  3  4  5  6  7  8  9
    context = [5, 6, 7, 8, 9, 1, 6, 7, 2, 6, 7]
    # suffix (6, 7): latest earlier occurrence at 6..7, followed by 2, 6, 7
    assert lookup(context).draft(3) == [2, 6, 7]
    # the 3-gram (1, 2, 3) wins over the later occurrence of the 2-gram (2, 3)
    assert lookup([1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3]).draft(2) == [4, 9]


def test_a_draft_is_cut_at_the_end_of_the_context_and_at_the_length() -> None:
    assert lookup([4, 4]).draft(5) == [4]
    assert lookup([1, 2, 3, 1, 2]).draft(1) == [3]
    assert lookup([1, 2, 3, 1, 2]).draft(0) == []


def test_nothing_is_drafted_when_the_suffix_never_occurred() -> None:
    assert lookup([1, 2, 3, 4]).draft(4) == []
    assert lookup([]).draft(4) == []


def test_the_index_grows_with_the_tokens() -> None:
    index = lookup([1, 2, 3])
    assert index.draft(2) == []
    index.extend([9, 1, 2])
    assert index.draft(2) == [3, 9]
    index.extend([7])
    assert index.draft(2) == []


def test_the_length_doubles_on_full_acceptance_and_falls_to_what_held() -> None:
    length = DraftLength(start=1, most=5)
    length.verified(drafted=1, accepted=1)
    assert length.wanted() == 2
    length.verified(drafted=2, accepted=2)
    assert length.wanted() == 4
    length.verified(drafted=4, accepted=4)
    assert length.wanted() == 5  # capped
    length.verified(drafted=5, accepted=2)
    assert length.wanted() == 2
    length.verified(drafted=2, accepted=0)
    assert length.wanted() == 1


def test_drafting_pauses_after_repeated_failures_and_probes_again() -> None:
    length = DraftLength(start=2, most=4, patience=3, pause=4, max_pause=8)
    for _ in range(3):
        assert length.wanted() > 0
        length.verified(drafted=1, accepted=0)
    assert length.wanted() == 0 and length.paused_for == 4
    length.decoded_plainly(3)
    assert length.wanted() == 0
    length.decoded_plainly(1)
    assert length.wanted() == 1  # the probe
    length.verified(drafted=1, accepted=0)  # fails: a longer pause at once
    assert length.paused_for == 8
    length.decoded_plainly(8)
    length.verified(drafted=1, accepted=0)
    assert length.paused_for == 8  # capped at max_pause
    length.decoded_plainly(8)
    length.verified(drafted=1, accepted=1)  # a probe that holds ends the failures
    assert length.failures == 0 and length.wanted() == 2
    length.verified(drafted=2, accepted=0)
    assert length.wanted() == 1  # one failure: no pause yet


def test_no_draft_means_no_verdict() -> None:
    length = DraftLength(start=2)
    length.verified(drafted=0, accepted=0)
    assert length.wanted() == 2 and length.failures == 0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        PromptLookup(max_ngram=0)
    with pytest.raises(ValueError):
        DraftLength(start=MAX_DRAFT + 1)
