"""Capacity reports to the Meshnet Tracker (`meshnet.tracker/v1`, models in
`meshnet.api.tracker`): ask every stage for GetInfo/GetCapacity under a deadline, build
the report (available only on a certified lane with every stage healthy), send it on
change and at least every N seconds with bounded, jittered retries.

    collect       the stages' answers            report      the report; availability
    schedule      when a report is due           client      POST with retries
    reporter      one step of all of that        metrics     sent/failed/retries/last
    kubernetes    inputs from cluster objects    local       inputs of `meshnet up`
    schema        the published JSON schema      validate    reports against it
    settings      MESHNET_TRACKER_*/CERTIFY_*    inputs      plain data between them
    planner       a daemon pass as a Plan        acceptance  a route's draft acceptance
"""
