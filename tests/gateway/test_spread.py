"""Which replica a new session goes to: the most free slots; among equals the one that
served the longest start of its prompt (its prefix cache may hold it), then the
conversation's favourite."""

from __future__ import annotations

from meshnet.gateway.spread import (
    REUSABLE_CHARACTERS,
    Candidate,
    RecentPrompts,
    affinity,
    common_start,
    conversation_key,
    pick,
    prompt_text,
)

SCAFFOLD = "You are a coding agent. Tools: read_file, write_file, run_tests. " * 20


def test_a_session_goes_to_the_replica_with_the_most_free_slots() -> None:
    replicas = [Candidate("0", 1), Candidate("1", 3), Candidate("2", 2)]
    for key in ("a", "b", "c", ""):
        assert pick(replicas, key) == Candidate("1", 3)


def test_no_replica_is_picked_when_none_has_a_free_slot() -> None:
    assert pick([Candidate("0", 0), Candidate("1", -1)], "a") is None
    assert pick([], "a") is None


def test_among_equals_a_conversation_keeps_its_replica_and_conversations_spread() -> None:
    equal = [Candidate(str(r), 2) for r in range(3)]
    keys = [f"user {n}" for n in range(60)]
    chosen = {key: pick(equal, key) for key in keys}
    assert all(pick(list(reversed(equal)), key) == chosen[key] for key in keys)  # stable
    assert {c.name for c in chosen.values() if c} == {"0", "1", "2"}  # spread


def test_a_replica_that_comes_or_goes_moves_only_the_conversations_it_must() -> None:
    three = [Candidate(str(r), 2) for r in range(3)]
    keys = [f"user {n}" for n in range(60)]
    before = {key: pick(three, key) for key in keys}
    after = {key: pick(three[:2], key) for key in keys}  # replica 2 scaled away
    moved = [key for key in keys if before[key] != after[key]]
    assert moved and all(before[key] == Candidate("2", 2) for key in moved)
    assert affinity("k", "0") == affinity("k", "0")


def test_a_chat_is_known_by_its_first_user_message_over_its_turns() -> None:
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    later = [*first, {"role": "assistant", "content": "hello"},
             {"role": "user", "content": "more"}]
    assert conversation_key("chat", first, "") == conversation_key("chat", later, "") == "hi"
    assert conversation_key("completion", (), "Once upon") == "Once upon"
    assert conversation_key("completion", (), (1, 2, 3)) == "1,2,3"


def test_among_equals_the_replica_that_served_the_prompts_start_takes_it() -> None:
    served = RecentPrompts()
    served.remember(prompt_text("chat", [{"role": "system", "content": SCAFFOLD},
                                         {"role": "user", "content": "fix test_a"}], ""))
    fresh = RecentPrompts()
    for n in range(40):  # whatever the conversation's own favourite
        text = prompt_text("chat", [{"role": "system", "content": SCAFFOLD},
                                    {"role": "user", "content": f"task {n}"}], "")
        candidates = [Candidate("0", 2, fresh.shared(text)), Candidate("1", 2, served.shared(text))]
        assert pick(candidates, f"task {n}") == candidates[1]
        # more free slots still come first: a cached prefix does not pile sessions up
        roomier = [Candidate("0", 3, fresh.shared(text)), candidates[1]]
        assert pick(roomier, f"task {n}") == roomier[0]


def test_a_short_shared_start_is_no_prefix_and_the_record_forgets_old_prompts() -> None:
    record = RecentPrompts(keep=2)
    record.remember("x" * (REUSABLE_CHARACTERS - 1) + "a")
    assert record.shared("x" * (REUSABLE_CHARACTERS - 1) + "b") == 0  # under one block
    record.remember(SCAFFOLD + "one")
    assert record.shared(SCAFFOLD + "two") == len(SCAFFOLD)
    record.remember("other")
    record.remember("another")  # the scaffold's prompt is no longer among the last two
    assert record.shared(SCAFFOLD + "two") == 0


def test_the_shared_start_is_counted_in_characters() -> None:
    assert [common_start(a, b) for a, b in [("", "abc"), ("abc", "abd"), ("abc", "abc"),
                                             ("abcdef", "abc"), ("xbc", "abc")]] == [0, 2, 3, 3, 0]
