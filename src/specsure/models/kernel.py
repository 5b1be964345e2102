"""The C decode kernel (decode_kernel.c): built once per machine with the system C compiler, loaded with ctypes.

A bfloat16 one-token step through eager PyTorch costs about twice its weight reads on a small
model; the kernel runs a whole run of decoder layers in one call, for one row (a decode step) or
a few (a verify step, a batch), its products on AMX tiles where Linux grants them, else on
AVX512-BF16 dot-product tiles. It needs a CPU with AVX512-BF16 and a C compiler; without
either, `load` says why and the torch ops run instead (`CausalLM.path` names the reason, so the
fallback is never silent). `SPECSURE_KERNEL=0` turns it off; `SPECSURE_KERNEL=dot` keeps it but
leaves AMX alone. The library is compiled into the user's cache under a name that hashes the
source, the flags and the compiler, and loaded after torch, so its OpenMP calls land in torch's
own libgomp (one thread pool, sized by `torch.set_num_threads`).
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import torch

from specsure.config.cpu import cpu_flags
from specsure.config.dtype_choice import KERNEL_ENV, build_blocker, c_compiler
from specsure.config.checkpoint import cache_root

logger = logging.getLogger(__name__)

T = TypeVar("T")

SOURCE = Path(__file__).with_name("decode_kernel.c")
FLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mamx-tile", "-mamx-bf16", "-fopenmp",
         "-shared", "-fPIC")
_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")
_ENV = KERNEL_ENV
MAX_HEAD_DIM = 512
"""decode_kernel.c's MAX_DIM: its attention keeps a head's query and output in registers."""


class LayerStruct(ctypes.Structure):
    """decode_kernel.c's Layer: one decoder layer's weights and KV cache buffers."""

    _fields_ = [(name, ctypes.c_void_p) for name in
                ("input_norm", "qkv", "qkv_bias", "o", "o_bias", "post_norm", "gate_up", "down", "keys", "values")]
    _fields_ += [("capacity", ctypes.c_int64), ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p),
                 ("window", ctypes.c_int64), ("attn_out_norm", ctypes.c_void_p), ("mlp_out_norm", ctypes.c_void_p),
                 ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p), ("gemma", ctypes.c_int64)]
    """``q_norm`` and ``k_norm``: Qwen3's and Gemma 3's per-head norms (NULL without); ``window``: a sliding
    window (0: none); Gemma's output norms, a layer's own RoPE table (NULL: the call's), and ``gemma``:
    float32 norm factors 1 + w and a GELU-gated MLP."""


class SegmentStruct(ctypes.Structure):
    """decode_kernel.c's Segment: one sequence's new rows in one layer's KV cache, and its mask."""

    _fields_ = [("keys", ctypes.c_void_p), ("values", ctypes.c_void_p), ("capacity", ctypes.c_int64),
                ("start", ctypes.c_int64), ("length", ctypes.c_int64), ("mask", ctypes.c_void_p)]


class ShapeStruct(ctypes.Structure):
    """decode_kernel.c's and float_kernel.c's Shape: the decoder's dimensions."""

    _fields_ = [(name, ctypes.c_int64) for name in ("hidden", "heads", "kv_heads", "head_dim", "intermediate")]
    _fields_ += [("eps", ctypes.c_float)]
    # the scores' factor (0 for 1 / sqrt(head_dim)) and their soft cap (0: none), Gemma's, and the dims
    # of a head that RoPE turns (0: all)
    _fields_ += [("scale", ctypes.c_float), ("softcap", ctypes.c_float), ("rotary", ctypes.c_int64)]


class RowOps:
    """What both C kernels (bf16 and float32) do between a layer's products, with one signature:
    the draft heads' C paths call them on whichever kernel the target runs. ``library`` is the
    loaded CDLL; tensors are in the kernel's dtype."""

    library: ctypes.CDLL

    def attend_rows(self, shape: ShapeStruct, segments: ctypes.Array, first: int, count: int, qkv: torch.Tensor,
                    cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor) -> None:
        """RoPE, cache writes and attention for ``count`` segments from ``segments[first]`` (one layer's)."""
        self.library.attend_rows(ctypes.byref(shape), ctypes.byref(segments, first * ctypes.sizeof(SegmentStruct)),
                                 count, qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr())

    def add_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor | None,
                 out: torch.Tensor | None, eps: float) -> None:
        """``x += delta`` (skipped for None), then ``out = RMSNorm(x) * weight`` (skipped for None); in
        bf16 rounded as torch rounds."""
        rows, hidden = x.shape
        self.library.add_norm(x.data_ptr(), None if delta is None else delta.data_ptr(),
                              None if weight is None else weight.data_ptr(), None if out is None else out.data_ptr(),
                              rows, hidden, eps)

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        """``out = SiLU(gate) * up`` for [rows, 2 * inter] -> [rows, inter]."""
        self.library.silu_mul(gate_up.data_ptr(), out.data_ptr(), out.shape[0], out.shape[1])


@dataclass(frozen=True)
class Kernel(RowOps):
    """The loaded library's entry points."""

    library: ctypes.CDLL
    amx: bool
    """Whether the products run on AMX tiles (bit-identical to oneDNN's AMX results); otherwise on
    AVX512-BF16 dot-product tiles (Zen 4, Cooper Lake, or AMX refused by Linux)."""

    dtype = torch.bfloat16
    layer_struct = LayerStruct

    def decode_layers(self, shape: ShapeStruct, layers: ctypes.Array, first: int, count: int, pos: int,
                      cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor, scratch: torch.Tensor) -> None:
        """Run layers ``first .. first + count`` on ``x`` ([hidden] bf16, in place) at position ``pos``."""
        self.library.decode_layers(ctypes.byref(shape), ctypes.byref(layers, first * ctypes.sizeof(LayerStruct)),
                                   count, pos, cos.data_ptr(), sin.data_ptr(), x.data_ptr(), scratch.data_ptr())

    def decode_rows(self, shape: ShapeStruct, layers: ctypes.Array, first: int, count: int, segments: ctypes.Array,
                    per_layer: int, cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor,
                    scratch: torch.Tensor) -> None:
        """Run layers ``first .. first + count`` on the rows ``x`` ([rows, hidden] bf16, in place);
        ``segments`` holds ``per_layer`` segments for each layer, layer 0's first."""
        self.library.decode_rows(ctypes.byref(shape), ctypes.byref(layers, first * ctypes.sizeof(LayerStruct)), count,
                                 ctypes.byref(segments, first * per_layer * ctypes.sizeof(SegmentStruct)), per_layer,
                                 x.shape[0], cos.data_ptr(), sin.data_ptr(), x.data_ptr(), scratch.data_ptr())

    @staticmethod
    def rows_scratch(shape: ShapeStruct, rows: int) -> torch.Tensor:
        """The bf16 scratch buffer `decode_rows` needs for ``rows`` rows of a decoder of ``shape``."""
        per_row = 2 * shape.hidden + (2 * shape.heads + 2 * shape.kv_heads) * shape.head_dim + 3 * shape.intermediate
        return torch.empty(rows * per_row, dtype=torch.bfloat16)

    def add_gemma_norm(self, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float) -> None:
        """``out = RMSNorm(x) * weight`` for bf16 rows ``x`` in Gemma's form: ``weight`` the float32 factors
        1 + w, the product in float32, rounded to bf16 once."""
        rows, hidden = x.shape
        self.library.add_gemma_norm(x.data_ptr(), None, weight.data_ptr(), out.data_ptr(), rows, hidden, eps)

    def with_amx(self, wanted: bool) -> "Kernel":
        """The kernel with AMX products on (where this CPU and Linux allow) or off. The switch is the
        library's, so it applies to every model in the process."""
        # Asking Linux for the tile registers on a CPU without them would only fail; skip it there.
        wanted = wanted and {"amx_tile", "amx_bf16"} <= cpu_flags()
        return Kernel(self.library, bool(self.library.kernel_init(int(wanted))))

    def linear_rows(self, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T`` for bf16 rows ``x`` ([m, in]) -> [m, out] bf16; each row's bits do not depend on m."""
        out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.bfloat16)
        self.library.linear_rows(weight.data_ptr(), x.data_ptr(), out.data_ptr(), weight.shape[0], weight.shape[1],
                                 x.shape[0])
        return out



def _compiler_version(cc: str) -> str:
    done = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    return done.stdout.splitlines()[0] if done.stdout else cc


def build_library(cc: str, source_path: Path, flags: tuple[str, ...], stem: str) -> Path:
    """Compile ``source_path`` into the cache (once per source, flags and compiler); return its path."""
    source = source_path.read_bytes()
    key = hashlib.sha256(source + " ".join(flags).encode() + _compiler_version(cc).encode()).hexdigest()[:16]
    target = cache_root() / "kernels" / f"{stem}-{key}.so"
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder = target.parent.lstat()
    if folder.st_uid == os.geteuid() and stat.S_ISDIR(folder.st_mode) and folder.st_mode & 0o022:
        os.chmod(target.parent, 0o700)  # made under a group-writable umask before this check: the user's own to close
    if (unsafe := _not_private(target.parent)) is not None:
        # Native code runs in this process: a library another user could have placed or replaced is
        # never loaded. This one is built in a private folder instead, each time, and removed at exit.
        logger.warning("%s %s, so its compiled kernels are not trusted; building into a private temporary folder "
                       "instead (set XDG_CACHE_HOME to a folder only you can write to keep them)", target.parent, unsafe)
        private = tempfile.mkdtemp(prefix="specsure-kernels-")
        atexit.register(shutil.rmtree, private, True)  # a mapped library outlives its file on Linux
        target = Path(private) / target.name
    elif target.exists():
        if (unsafe := _not_private(target)) is None:
            return target
        logger.warning("%s %s; building it again", target, unsafe)
    # Written beside the target and renamed: a concurrent process never loads half a file.
    _sweep_partials(target.parent)
    fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".so.partial")
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, str(source_path), "-o", partial, "-lm"], capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no output"])[0]
            raise RuntimeError(f"{cc} failed on {source_path.name}: {first}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return target


STALE_PARTIAL_S = 3600.0
"""A half-built library this old is a killed build's (gcc outlives a parent killed with -9), not one
in progress: builds take seconds."""


def _sweep_partials(folder: Path) -> None:
    now = time.time()
    for leftover in folder.glob("*.so.partial"):
        try:
            if now - leftover.lstat().st_mtime > STALE_PARTIAL_S:
                leftover.unlink()
        except OSError:  # another process's sweep got there first
            continue


def _not_private(path: Path) -> str | None:
    """Why ``path`` (the kernels folder, or a library in it) could hold another user's code, or None:
    owned by someone else, or writable by the group or others. Symbolic links are not followed."""
    info = path.lstat()
    if info.st_uid != os.geteuid():
        return "belongs to another user"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "can be written by other users"
    return None


def _bind(library: ctypes.CDLL) -> Kernel:
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    signatures = {
        "decode_layers": [pointer, pointer, size, size, pointer, pointer, pointer, pointer],
        "decode_rows": [pointer, pointer, size, pointer, size, size, pointer, pointer, pointer, pointer],
        "linear_rows": [pointer, pointer, pointer, size, size, size],
        "attend_rows": [pointer, pointer, size, pointer, pointer, pointer, pointer],
        "add_norm": [pointer, pointer, pointer, pointer, size, size, ctypes.c_float],
        "add_gemma_norm": [pointer, pointer, pointer, pointer, size, size, ctypes.c_float],
        "silu_mul": [pointer, pointer, size, size],
    }
    for name, arguments in signatures.items():
        function = getattr(library, name)
        function.argtypes, function.restype = arguments, None
    library.kernel_init.argtypes, library.kernel_init.restype = [ctypes.c_int], ctypes.c_int
    return Kernel(library, False).with_amx(os.environ.get(_ENV, "1") != "dot")


_loaded: tuple[Kernel | None, str] | None = None


def load() -> tuple[Kernel | None, str]:
    """(kernel, why): the kernel, or None and the reason the torch ops run instead. Built once per process."""
    global _loaded
    if _loaded is None:
        _loaded = _load()
        if _loaded[0] is None:
            logger.info("bf16 one-token steps run on torch ops: %s", _loaded[1])
    return _loaded


def open_library(source: Path, flags: tuple[str, ...], stem: str, cpu_needed: tuple[str, ...],
                 bind: Callable[[ctypes.CDLL], T]) -> tuple[T | None, str]:
    """(bound, why): build ``source`` (once per machine) and ``bind`` it, or None and the reason
    (turned off, a CPU flag missing, no compiler, a failed build or load), with the library's
    file name as ``why`` when it loaded."""
    blocker, cc = build_blocker(cpu_needed, source.name), c_compiler()
    if blocker or cc is None:
        return None, blocker or "no C compiler (cc or gcc) is on PATH"
    try:
        path = build_library(cc, source, flags, stem)
        return bind(ctypes.CDLL(str(path))), path.name
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        return None, f"the C kernel did not build or load: {error}"


def _load() -> tuple[Kernel | None, str]:
    kernel, why = open_library(SOURCE, FLAGS, "decode", _CPU_FLAGS, _bind)
    if kernel is None:
        return None, why
    return kernel, f"{'AMX' if kernel.amx else 'AVX512-BF16 (no AMX)'} products, {why}"
