"""Container images built with buildah (`meshnet images build`, `make images`): the operator,
the CPU worker and the CPU certification image, from images/*.Dockerfile, on a Debian base
made here with debootstrap when no registry is reachable, cached by a digest of their
inputs."""
