"""The exceptions every meshnet command may raise.

    MeshnetError            a problem the user can act on; the CLI prints it, exits 1
    ├── PinError            llama.cpp pin: source, hash, patch or build refused
    └── ...                 further subsystems add their own subclasses
"""


class MeshnetError(Exception):
    """A failure explained in words the user can act on (no traceback needed)."""


class PinError(MeshnetError):
    """The pinned llama.cpp could not be fetched, verified, patched or built."""
