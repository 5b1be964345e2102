"""The draft heads shipped with specsure for its packaged default model (made by `make heads`).

When the target is the packaged default and the user names ``eagle3`` or ``mtp`` without a
``model``, resolution fills ``model`` with the shipped head and says so (source ``default``).
An explicit ``model``, or ``"model": null``, is never replaced. The folders live inside the
package (``specsure/heads/``), so an installed specsure finds them; docs/training.md says how
they were trained and from what.
"""

from __future__ import annotations

from pathlib import Path

from specsure.config.checkpoint import default_gguf_path
from specsure.config.cpu import cpu_bf16_flags
from specsure.config.dtype_choice import auto_dtype
from specsure.config.token_tree import DraftTree

HEADS_DIR = Path(__file__).resolve().parent.parent / "heads"
"""Where the shipped head folders are: ``src/specsure/heads/`` in a checkout."""

SHIPPED: dict[str, str] = {"eagle3": "smollm2-135m-eagle3", "mtp": "smollm2-135m-mtp"}
"""Method -> folder name of the head trained for SmolLM2-135M-Instruct."""

TREE_FAST_BF16 = DraftTree([(0,), (1,)])
"""The tree the shipped heads draft by default where they run in bfloat16 on a CPU with fast bf16
(dtype 'bfloat16', or 'auto' there when the float32 kernel cannot run), and in a config exported
to another engine: their first two
choices, one head step. There a verify row costs 6% (AMX) to 10% (Zen 4's dot-product tiles) of a
decode step, and the two-node tree measured best (BENCHMARKS.md, "Token trees", "Learned heads")."""
TREE_FLOAT32 = DraftTree([(0,)])
"""The default where they run in float32 (dtype 'auto' runs the default model so on the float32
kernel over its GGUF's blocks, wherever that kernel builds): the first choice alone, a chain of one. There a
verify row costs about a sixth of a decode step, and a chain of one measured 1.02x of plain for both
heads against 0.94x to 0.96x for the two-node tree (BENCHMARKS.md, "Draft heads on Q8_0 blocks")."""
_FLOAT32_WHY = "where a verify row costs about a sixth of a decode step and the first choice alone measured best"


def shipped_tree(method: str, dtype: str | None = "auto") -> tuple[DraftTree | None, str]:
    """(tree, why): the token tree a shipped ``method`` head drafts when the user sets neither
    num_speculative_tokens nor a tree, for a run in ``dtype`` on this CPU ('auto', 'float32',
    'bfloat16', 'float16'), or for an export to another engine (None). None for a method
    without a shipped head."""
    if method not in SHIPPED:
        return None, ""
    if dtype is None:
        return TREE_FAST_BF16, ("the config is for another engine, so it gets the tree measured best where a verify "
                                "row is nearly free, as on a GPU or a CPU with fast bf16")
    flags = cpu_bf16_flags() if dtype in ("auto", "bfloat16") else ()
    if dtype == "auto" and flags and auto_dtype(default_gguf_path())[0] == "float32":
        return TREE_FLOAT32, ("dtype 'auto' runs the default model in float32 on its GGUF's blocks, faster than "
                              f"bfloat16 even on this CPU with fast bf16 ({', '.join(flags)}), {_FLOAT32_WHY}")
    if flags:
        runs = "dtype 'auto' runs bfloat16 there" if dtype == "auto" else "the run is in bfloat16"
        return TREE_FAST_BF16, (f"this CPU has fast bf16 ({', '.join(flags)}) and {runs}, where a verify row costs a "
                                "tenth of a decode step or less and the first two choices measured best")
    if dtype == "auto":
        return TREE_FLOAT32, f"this CPU reports no fast bf16, so dtype 'auto' runs float32, {_FLOAT32_WHY}"
    if dtype == "bfloat16":
        return TREE_FLOAT32, ("dtype 'bfloat16' on a CPU without fast bf16 runs emulated, where a verify row costs at "
                              "least as much as in float32; in float32 the first choice alone measured best")
    return TREE_FLOAT32, f"dtype {dtype!r} was given, {_FLOAT32_WHY}"


def shipped_head(method: str) -> str | None:
    """The shipped head's folder for ``method`` on the default model, or None when there is none."""
    name = SHIPPED.get(method)
    if name is None:
        return None
    folder = HEADS_DIR / name
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        return None
    return str(folder)
