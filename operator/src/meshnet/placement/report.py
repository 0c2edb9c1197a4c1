"""The measured links as a measuring Job hands them back: a compact JSON document that fits
a container's termination message (4 KiB: 9 machines' 72 links fit), and its reading."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from meshnet.placement.order import Links, MeasuredLink

MAX_BYTES = 4096  # what the kubelet keeps of a termination message


class ReportError(ValueError):
    """A document that is not a measurement of links."""


def links_document(machines: Sequence[str], links: Links) -> str:
    """{"machines": [...], "links": [[from index, to index, rtt s, bytes/s], ...]}."""
    index = {name: i for i, name in enumerate(machines)}
    rows = [[index[a], index[b], float(f"{link.rtt_s:.6g}"), float(f"{link.bytes_per_s:.4g}")]
            for (a, b), link in sorted(links.items()) if a in index and b in index]
    text = json.dumps({"machines": list(machines), "links": rows}, separators=(",", ":"))
    if len(text.encode()) > MAX_BYTES:
        raise ReportError(f"{len(machines)} machines' links take {len(text)} bytes, over the"
                          f" {MAX_BYTES} a termination message keeps")
    return text


def read_links(text: str) -> tuple[list[str], Links]:
    """The machines and links of `links_document`; ReportError for anything else."""
    try:
        document = json.loads(text)
        machines = [str(m) for m in document["machines"]]
        links = {(machines[a], machines[b]): MeasuredLink(float(rtt), float(rate))
                 for a, b, rtt, rate in document["links"]}
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise ReportError(f"not a links document: {error}") from None
    if any(not (math.isfinite(x.rtt_s) and x.rtt_s >= 0 and x.bytes_per_s > 0)
           for x in links.values()):
        raise ReportError("a link measured no usable figures")
    return machines, links
