"""Is a set of GGUF files exactly one complete model? Pure checks on names and headers."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from meshnet.artifacts.gguf_header import GGUFHeader
from meshnet.errors import IncompleteSplitSet

# llama.cpp finds the other splits from the first one's path with this exact pattern.
_SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class SplitName:
    prefix: str
    no: int  # 0-based, as in the `split.no` key
    count: int


def parse_split_name(name: str) -> SplitName | None:
    match = _SPLIT_NAME.match(name)
    if not match:
        return None
    return SplitName(match["prefix"], int(match["no"]) - 1, int(match["count"]))


def split_file_name(prefix: str, no: int, count: int) -> str:
    return f"{prefix}-{no + 1:05d}-of-{count:05d}.gguf"


def _missing_message(prefix: str, count: int, present: Iterable[int]) -> str:
    missing = sorted(set(range(count)) - set(present))
    names = ", ".join(split_file_name(prefix, no, count) for no in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    return f"split set {prefix} is incomplete: {len(missing)} of {count} missing ({names}{more})"


def check_split_names(names: Sequence[str]) -> None:
    """Refuse, from names alone, a list that is visibly not one complete split set."""
    parsed = [(name, parse_split_name(name)) for name in names if name.endswith(".gguf")]
    splits = [(name, split) for name, split in parsed if split is not None]
    if not splits:
        return
    groups = {(split.prefix, split.count) for _, split in splits}
    if len(groups) > 1:
        listed = ", ".join(f"{prefix} ({count} splits)" for prefix, count in sorted(groups))
        raise IncompleteSplitSet(f"files of more than one split set: {listed}")
    unsplit = [name for name, split in parsed if split is None]
    if len(unsplit) > 1:  # one may be a drafter GGUF beside the split model: its header says
        raise IncompleteSplitSet(
            f"split files mixed with unsplit GGUF files: {', '.join(sorted(unsplit))}"
        )
    ((prefix, count),) = groups
    numbers = [split.no for _, split in splits]
    if len(set(numbers)) != count or any(no >= count for no in numbers):
        raise IncompleteSplitSet(_missing_message(prefix, count, numbers))


def order_split_set(headers: Sequence[GGUFHeader]) -> list[GGUFHeader]:
    """The headers in split order, or IncompleteSplitSet saying what is missing or mixed.

    One unsplit file is a complete set; otherwise every file must carry the same
    `split.count` and `split.tensors.count`, each `split.no` exactly once, names in
    llama.cpp's pattern with one prefix, tensors adding up, and one architecture.
    """
    if not headers:
        raise IncompleteSplitSet("no GGUF files given")
    unsplit = [h.name for h in headers if not h.is_split]
    if unsplit:
        if len(headers) == 1:
            if headers[0].architecture is None:
                raise IncompleteSplitSet(f"{headers[0].name} has no general.architecture")
            return list(headers)
        raise IncompleteSplitSet(
            f"{len(headers)} GGUF files but {', '.join(sorted(unsplit))} "
            "is a whole model, not a split: give one model at a time"
        )
    counts = {h.split_count for h in headers}
    totals = {h.split_tensors for h in headers}
    if len(counts) > 1 or len(totals) > 1:
        raise IncompleteSplitSet(
            "files of different split sets (split.count "
            f"{sorted(c or 0 for c in counts)}, "
            f"split.tensors.count {sorted(t or 0 for t in totals)})"
        )
    count = counts.pop() or 0
    by_no: dict[int, GGUFHeader] = {}
    for header in headers:
        no = header.split_no if header.split_no is not None else -1
        if no in by_no:
            raise IncompleteSplitSet(
                f"{header.name} and {by_no[no].name} both claim split {no + 1} of {count}"
            )
        if not 0 <= no < count:
            raise IncompleteSplitSet(f"{header.name} claims split {no + 1} of {count}")
        by_no[no] = header
    first_name = parse_split_name(by_no[0].name) if 0 in by_no else None
    prefix = first_name.prefix if first_name else headers[0].name.removesuffix(".gguf")
    if len(by_no) != count:
        raise IncompleteSplitSet(_missing_message(prefix, count, by_no))
    ordered = [by_no[no] for no in range(count)]
    for no, header in enumerate(ordered):
        if header.name != split_file_name(prefix, no, count):
            raise IncompleteSplitSet(
                f"{header.name} holds split {no + 1} of {count} but llama.cpp will look for "
                f"{split_file_name(prefix, no, count)}"
            )
    architectures = {h.architecture for h in ordered if h.architecture is not None}
    if len(architectures) > 1:
        raise IncompleteSplitSet(
            f"one split set with several architectures: {sorted(architectures)}"
        )
    if ordered[0].architecture is None:
        raise IncompleteSplitSet(f"{ordered[0].name} (the first split) has no general.architecture")
    tensors = sum(len(h.tensor_bytes) for h in ordered)
    if tensors != totals.pop():
        raise IncompleteSplitSet(
            f"the splits hold {tensors} tensors but declare split.tensors.count "
            f"{ordered[0].split_tensors}: some split is truncated or from another set"
        )
    return ordered
