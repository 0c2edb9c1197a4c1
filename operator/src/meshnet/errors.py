"""The exceptions every meshnet command may raise.

    MeshnetError            a problem the user can act on; the CLI prints it, exits 1
    ├── PinError            llama.cpp pin: source, hash, patch or build refused
    ├── ArtifactError       model artifact: each subclass's `reason` is a status reason
    │   ├── ArtifactSpecError   the ModelArtifact file itself is unusable (InvalidSpec)
    │   ├── IncompleteSplitSet  a split-GGUF set is partial, mixed or inconsistent
    │   ├── StorageRefused      destination under /home, unwritable, or too little space
    │   ├── DownloadFailed      the source could not deliver the bytes (after retries)
    │   ├── HashMismatch        bytes arrived but their sha256 is not the manifest's
    │   ├── ExpectationMismatch GGUF headers contradict spec.expectations
    │   └── DrafterMismatch     the drafter GGUF does not fit the model it drafts for
    ├── OperatorError       operator settings or cluster access refused
    │   └── KubeApiError    the Kubernetes API answered with an error status
    ├── BuildError          a CMake step of our native build failed (meshnet.buildsteps.cmake)
    ├── RouteError          the data plane (meshnet.route.errors)
    │   ├── RouteRefused        the handshake found the stages are not one route
    │   ├── PromptTooLong       the prompt does not fit the route's context (generate: exit 3)
    │   ├── StageError          a stage answered with an ErrorInfo reason
    │   └── RecoveryFailed      re-prefilling after CACHE_MISS/EPOCH_MISMATCH did not help
    └── the local backend (meshnet.local): RouteFileError, ProvisionError, RouteNotFound,
        NotListening (a chained stage waits for the stage it relays to)
"""


class MeshnetError(Exception):
    """A failure explained in words the user can act on (no traceback needed)."""


class PinError(MeshnetError):
    """The pinned llama.cpp could not be fetched, verified, patched or built."""


class ArtifactError(MeshnetError):
    """A model artifact could not be described, provisioned or verified."""

    reason = "ArtifactFailed"
    # False where running again cannot help (a spec or storage problem).
    retryable = False


class ArtifactSpecError(ArtifactError):
    reason = "InvalidSpec"


class IncompleteSplitSet(ArtifactError):
    reason = "IncompleteSplitSet"


class StorageRefused(ArtifactError):
    reason = "StorageRefused"


class DownloadFailed(ArtifactError):
    reason = "DownloadFailed"
    retryable = True


class HashMismatch(ArtifactError):
    reason = "HashMismatch"
    # A transfer can corrupt bytes; a fresh download may succeed.
    retryable = True

    def __init__(self, name: str, expected: str, actual: str) -> None:
        super().__init__(f"{name}: sha256 mismatch: expected {expected}, got {actual}")
        self.name = name
        self.expected = expected
        self.actual = actual


class ExpectationMismatch(ArtifactError):
    reason = "ExpectationMismatch"


class DrafterMismatch(ArtifactError):
    reason = "DrafterMismatch"


class OperatorError(MeshnetError):
    """The operator cannot start or reach the cluster (bad settings, no credentials)."""


class KubeApiError(OperatorError):
    """The Kubernetes API refused a request; `status` is the HTTP status code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API error {status}: {message}")
        self.status = status
