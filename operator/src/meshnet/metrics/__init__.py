"""The controller's Prometheus metrics, shared by the operator and `meshnet up` (which
must not import the operator's kopf machinery):

    controller       reconciles, their triggers, errors and durations, and the collectors
    resource_status  the conditions, epochs, stages and artifacts of what it watches
"""
