"""Certification of a route's lane: parity against the unsplit reference on a fixed prompt
set, and the useful-speed gate, measured on the route's own hardware.

    certificate = certify(endpoints, lane, Reference(binary, model))

The certificate is keyed by lane (backend, GPU product, manifestDigest, recipeDigest);
only a passing certificate of a route's exact lane lets a Tracker report say available.
"""
