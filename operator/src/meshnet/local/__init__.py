"""The local backend: the operator's plan applied to worker processes on loopback.

`meshnet up -f FILE` reads a ModelArtifact and a ShardRoute (the kinds users apply to a
cluster), provisions the artifact on this machine and runs one worker per stage.
"""
