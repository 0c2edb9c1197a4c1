"""Capacity reports to the Meshnet Tracker (`meshnet.tracker/v1`, models in
`meshnet.api.tracker`): collect GetInfo/GetCapacity from every stage under a deadline,
build the report (available only on a certified lane with every stage healthy), send it
on change and at least every N seconds with bounded, jittered retries.

    collect     the stages' answers          report     the report, and availability
    schedule    when a report is due         client     POST with retries
    reporter    one step of all of that      kubernetes / local   inputs per backend
"""
