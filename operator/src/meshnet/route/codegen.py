"""Generate the Python protobuf/gRPC code of proto/ into meshnet._proto (build time).

Run `python -m meshnet.route.codegen` (the Makefile does). The output is gitignored;
a `STAMP` file records the digest of the .proto sources so stale code is noticed.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_FILES = ("meshnet/shard/v1/shard_service.proto",)
PACKAGE_DIR = Path(__file__).resolve().parents[1] / "_proto"
STAMP = "STAMP"


def proto_root() -> Path:
    """proto/ of the checkout this package was installed from (editable install)."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "proto" / PROTO_FILES[0]).is_file():
            return parent / "proto"
    raise FileNotFoundError("proto/ not found: meshnet must be installed from its checkout")


def sources_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for name in PROTO_FILES:
        digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    return digest.hexdigest()


def is_current(root: Path | None = None, out: Path = PACKAGE_DIR) -> bool:
    try:
        root = root or proto_root()
    except FileNotFoundError:
        return (out / STAMP).is_file()  # installed without sources: trust what is there
    stamp = out / STAMP
    return stamp.is_file() and stamp.read_text().strip() == sources_digest(root)


def generate(root: Path | None = None, out: Path = PACKAGE_DIR) -> Path:
    """Writes meshnet/_proto/meshnet/shard/v1/shard_service_pb2{,_grpc}.py(+.pyi)."""
    from grpc_tools import protoc  # type: ignore[import-untyped]  # build-time dependency

    root = root or proto_root()
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"--proto_path={root}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(str(root / name) for name in PROTO_FILES),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {', '.join(PROTO_FILES)}")
        generated = Path(tmp)
        # Generated imports name the proto package (`meshnet.shard.v1`), which would
        # resolve inside our own `meshnet` package: re-root them under meshnet._proto.
        for path in generated.rglob("*.py"):
            text = path.read_text()
            text = re.sub(r"^from meshnet\.", "from meshnet._proto.meshnet.", text, flags=re.M)
            path.write_text(text)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(generated, out)
    for directory in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        (directory / "__init__.py").touch()
    (out / STAMP).write_text(sources_digest(root) + "\n")
    return out


def main() -> None:
    out = generate()
    print(f"generated {', '.join(PROTO_FILES)} into {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
