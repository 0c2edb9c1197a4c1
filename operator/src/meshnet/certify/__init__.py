"""Certification of a route's lane: bit-exact parity against the unsplit reference on a
fixed prompt set, what the route promises (verify windows computed as one-row steps,
sessions at once computed as alone), and the useful-speed gate, measured on the route's own
hardware.

    certificate = certify(endpoints, lane, Reference(binary, model))

The certificate is keyed by lane (backend, GPU product, manifestDigest, recipeDigest, and
the promises: verify window rows, sessions at once);
only a passing certificate of a route's exact lane lets a Tracker report say available.
"""
