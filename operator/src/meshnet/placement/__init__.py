"""Placement from measured links: which machine serves which stage of a route, and where
its gateway runs, from the round trips and bandwidths measured between the machines.

    best = place(machines, links, row_bytes, topology="ring", gateways=candidates)
"""
