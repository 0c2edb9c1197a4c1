"""Where a route's pods find the route's key (meshnet.route.route_key): key `route.key` of
the route's own Secret, mounted read-only at ROUTE_KEY_DIR in its stage pods, its gateway
and its certification Jobs. The workers' --route-key-file, the gateway's and certify's
--route-key-file name ROUTE_KEY_FILE."""

from __future__ import annotations

from pathlib import PurePosixPath

ROUTE_KEY_DIR = "/etc/meshnet/route-key"
ROUTE_KEY_VOLUME = "route-key"  # the pod volume mounted there (certification copies it)
ROUTE_KEY_SECRET_KEY = "route.key"  # the key in the route's Secret
ROUTE_KEY_FILE = PurePosixPath(ROUTE_KEY_DIR, ROUTE_KEY_SECRET_KEY)
