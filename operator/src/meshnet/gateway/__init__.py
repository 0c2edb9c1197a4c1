"""meshnet.gateway: the route's front door, an OpenAI-compatible HTTP API (`meshnet serve`).

    requests    an OpenAI request body -> a typed Job, or the 400 it deserves (pure)
    responses   completion objects, stream chunks and error bodies, as OpenAI shapes them
    chat        the model's own chat template (from GetInfo) -> the prompt text
    text        token text as it streams: what may be shown, and where a stop string ends it
    admission   session slots, then a bounded queue, then 429
    routes      which stages serve the route now, and one driver for them
    metrics     TTFT, inter-token and end-to-end latency, tokens, running/waiting, outcomes
    server      the aiohttp application tying them together
"""
