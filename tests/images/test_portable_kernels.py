"""Our x86 dot kernels (patches 0006-0008) are in the portable build's CPU modules that
can run them: the haswell and skylakex modules take two rows at a time for Q4_1 and Q8_0
products, bit-identical to one row at a time, and the x64 baseline keeps ggml's one-row
loop. The modules are called directly (ctypes), as test-batch-kernels does in the native
build."""

from __future__ import annotations

import ctypes
import random
from pathlib import Path

import pytest

from .conftest import REPO

BUNDLE = REPO / ".work" / "images" / "worker-cpu"
GGML_TYPE_Q4_1, GGML_TYPE_Q8_0 = 3, 8
ROW = 256  # elements per row: 8 blocks of 32
FLOATS = ctypes.POINTER(ctypes.c_float)
FROM_FLOAT = ctypes.CFUNCTYPE(None, FLOATS, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, FLOATS, ctypes.c_size_t, ctypes.c_void_p,
                           ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class TypeTraitsCpu(ctypes.Structure):
    _fields_ = [("from_float", FROM_FLOAT), ("vec_dot", VEC_DOT),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def load_module(variant: str) -> ctypes.CDLL:
    ctypes.CDLL(str(BUNDLE / "lib" / "libggml-base.so.0"), mode=ctypes.RTLD_GLOBAL)
    module = ctypes.CDLL(str(BUNDLE / "bin" / f"libggml-cpu-{variant}.so"))
    module.ggml_cpu_init()
    module.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCpu)
    return module


def quantized_rows(module: ctypes.CDLL, type_: int, rows: int, seed: int) -> tuple[bytes, int]:
    base = ctypes.CDLL(str(BUNDLE / "lib" / "libggml-base.so.0"))
    base.ggml_row_size.restype = ctypes.c_size_t
    size = base.ggml_row_size(type_, ctypes.c_int64(ROW))
    traits = module.ggml_get_type_traits_cpu(type_).contents
    rng = random.Random(seed)
    out = ctypes.create_string_buffer(size * rows)
    for row in range(rows):
        values = (ctypes.c_float * ROW)(*(rng.uniform(-1, 1) for _ in range(ROW)))
        traits.from_float(values, ctypes.addressof(out) + row * size, ROW)
    return out.raw, size


def dots(module: ctypes.CDLL, type_: int, two_at_a_time: bool) -> list[float]:
    """x0.y0, x1.y0, x0.y1, x1.y1 of two quantized rows and two activation columns."""
    traits = module.ggml_get_type_traits_cpu(type_).contents
    x, bx = quantized_rows(module, type_, 2, seed=1)
    y, by = quantized_rows(module, traits.vec_dot_type, 2, seed=2)
    xs, ys = ctypes.create_string_buffer(x), ctypes.create_string_buffer(y)
    out = (ctypes.c_float * 4)()
    if two_at_a_time:  # s[0], s[1] for column 0, s[bs], s[bs+1] for column 1 (bs = 2)
        traits.vec_dot(ROW, out, 2, ctypes.addressof(xs), bx, ctypes.addressof(ys), by, 2)
    else:
        for column in range(2):
            for row in range(2):
                one = ctypes.cast(ctypes.byref(out, 4 * (2 * column + row)), FLOATS)
                traits.vec_dot(ROW, one, 0, ctypes.addressof(xs) + row * bx, 0,
                               ctypes.addressof(ys) + column * by, 0, 1)
    return list(out)


@pytest.fixture(scope="module")
def bundle(images: dict[str, object]) -> Path:
    """The worker image's bundle (the `images` fixture builds it)."""
    return BUNDLE


@pytest.mark.parametrize("variant", ["haswell", "skylakex"])
def test_the_avx2_modules_take_our_two_row_kernels_with_one_row_results(
        bundle: Path, variant: str) -> None:
    needs = {"haswell": {"avx2", "f16c", "fma"}, "skylakex": {"avx2", "f16c", "fma", "avx512f"}}
    if not needs[variant] <= cpu_flags():
        pytest.skip(f"this CPU cannot run the {variant} module")
    module = load_module(variant)

    for type_ in (GGML_TYPE_Q4_1, GGML_TYPE_Q8_0):
        assert module.ggml_get_type_traits_cpu(type_).contents.nrows == 2
        assert dots(module, type_, two_at_a_time=True) == dots(module, type_, False)


def test_the_x64_baseline_module_keeps_one_row_dots(bundle: Path) -> None:
    module = load_module("x64")

    for type_ in (GGML_TYPE_Q4_1, GGML_TYPE_Q8_0):
        assert module.ggml_get_type_traits_cpu(type_).contents.nrows == 1
