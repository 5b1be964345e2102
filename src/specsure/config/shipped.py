"""The draft heads shipped with specsure for its packaged default model (made by `make heads`).

When the target is the packaged default and the user names ``eagle3`` or ``mtp`` without a
``model``, resolution fills ``model`` with the shipped head and says so (source ``default``).
An explicit ``model``, or ``"model": null``, is never replaced. The folders live inside the
package (``specsure/heads/``), so an installed specsure finds them; docs/training.md says how
they were trained and from what.
"""

from __future__ import annotations

from pathlib import Path

from specsure.config.cpu import cpu_bf16_flags
from specsure.config.token_tree import DraftTree

HEADS_DIR = Path(__file__).resolve().parent.parent / "heads"
"""Where the shipped head folders are: ``src/specsure/heads/`` in a checkout."""

SHIPPED: dict[str, str] = {"eagle3": "smollm2-135m-eagle3", "mtp": "smollm2-135m-mtp"}
"""Method -> folder name of the head trained for SmolLM2-135M-Instruct."""

TREE_FAST_BF16 = DraftTree([(0,), (1,)])
"""The tree the shipped heads draft by default on a CPU with fast bf16 (dtype 'auto' runs bfloat16
there): their first two choices, one head step. There a verify row costs 6% (AMX) to 10% (Zen 4's
dot-product tiles) of a decode step, and the two-node tree measured best (BENCHMARKS.md, "Token
trees" and "Learned heads")."""
TREE_FLOAT32 = DraftTree([(0,)])
"""The default elsewhere (dtype 'auto' runs float32, the default model on the float32 kernel over
its GGUF's blocks): the first choice alone, a chain of one. There a verify row costs about a sixth
of a decode step, and a chain of one measured 1.02x of plain for both heads against 0.94x to 0.96x
for the two-node tree (BENCHMARKS.md, "Draft heads on Q8_0 blocks")."""


def shipped_tree(method: str) -> tuple[DraftTree | None, str]:
    """(tree, why): the token tree a shipped ``method`` head drafts when the user sets neither
    num_speculative_tokens nor a tree, on this CPU (None for a method without a shipped head)."""
    if method not in SHIPPED:
        return None, ""
    flags = cpu_bf16_flags()
    if flags:
        return TREE_FAST_BF16, (f"this CPU has fast bf16 ({', '.join(flags)}), where a verify row costs a tenth of a "
                                "decode step or less and the first two choices measured best")
    return TREE_FLOAT32, ("this CPU reports no fast bf16, so dtype 'auto' runs float32, where a verify row costs about "
                          "a sixth of a decode step and the first choice alone measured best")


def shipped_head(method: str) -> str | None:
    """The shipped head's folder for ``method`` on the default model, or None when there is none."""
    name = SHIPPED.get(method)
    if name is None:
        return None
    folder = HEADS_DIR / name
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        return None
    return str(folder)
