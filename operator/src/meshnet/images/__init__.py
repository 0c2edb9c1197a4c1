"""Container images built with buildah (`meshnet images build`, `make images`): the operator,
and per lane (cpu, vulkan, cuda) the worker and its certification image, from
images/*.Dockerfile, on a Debian base made here with debootstrap when no registry is
reachable, cached by a digest of their inputs."""
