"""Detection: what the checkpoints and paths say, as evidence. It never decides anything.

Evidence is ranked: checkpoint metadata first, path hints last. Resolution (resolution.py)
uses evidence only to fill unset fields, and to warn when it disagrees with the user.
"""

from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import PurePath
from typing import Collection, Final, Literal

from specsure.config.checkpoint import CheckpointInfo
from specsure.config.schema import MTP_METHOD_ALIASES
from specsure.config.speculators import KIND_KEY, KINDS, is_speculators

EvidenceSource = Literal["checkpoint", "path"]

EAGLE3_ARCHITECTURES: Final[frozenset[str]] = frozenset({
    "LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Qwen2ForCausalLM",
    "Eagle3Qwen3ForCausalLM", "Eagle3DeepseekV2ForCausalLM",
})
EAGLE_ARCHITECTURES: Final[frozenset[str]] = frozenset({
    "EagleLlamaForCausalLM", "LlamaForCausalLMEagle", "EagleQwen2ForCausalLM",
    "EagleDeepSeekMTPModel", "EagleMistralLarge3ForCausalLM",
})
# Tensors only EAGLE-3 heads hold; vLLM accepts layers.0.* for midlayer.*.
EAGLE3_TENSORS: Final[tuple[str, ...]] = ("d2t", "t2d", "midlayer.hidden_norm.weight", "layers.0.hidden_norm.weight")
# A standalone MTP head (the format specsure documents and its trainer writes).
SPECSURE_MTP_HEAD: Final[str] = "SpecsureMTPHead"
SPECSURE_MTP_MODEL_TYPE: Final[str] = "specsure_mtp"
MTP_HEAD_ARCHITECTURES: Final[frozenset[str]] = frozenset({SPECSURE_MTP_HEAD})
MTP_MODEL_TYPES: Final[frozenset[str]] = MTP_METHOD_ALIASES | {SPECSURE_MTP_MODEL_TYPE}
"""vLLM's MTP model types (the same names as its MTP method aliases), and specsure's own head's."""
WHOLE_MODEL_SUFFIXES: Final[tuple[str, ...]] = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
"""How transformers names a whole model's class (Llama, GPT-2, a multimodal Gemma 3); the head
architectures above end in ForCausalLM too, and are classified before this is consulted."""
WHOLE_MODEL_TENSOR: Final[str] = "model.embed_tokens.weight"
"""A whole causal LM's embedding as transformers names it; a head stores its own as embed_tokens.weight."""
# Path tokens that hint at a method, longest first so "eagle3" wins over "eagle".
PATH_HINTS: Final[tuple[tuple[str, str], ...]] = (("eagle3", "eagle3"), ("eagle", "eagle"), ("mtp", "mtp"))
PATH_COMPONENTS: Final[int] = 2

WHAT_IS: Final[dict[str, str]] = {
    "draft_model": "a whole causal LM",
    "eagle": "an EAGLE-1 head",
    "eagle3": "an EAGLE-3 head",
    "mtp": "an MTP head (or a model with MTP layers)",
}
"""What a checkpoint made for each method is, in the words every message uses."""


FOREIGN_HEADS: Final[dict[str, str]] = {"medusa": "a Medusa head", "mlp_speculator": "an MLP speculator"}
"""Draft model_types made for a method of earlier vLLM releases that specsure does not run (vLLM
0.33.0 has neither method any more), with what the checkpoint is, in a message's words."""


def foreign_head(info: CheckpointInfo) -> str | None:
    """A sentence naming the vLLM-only head kind ``info`` is, with its signal; None for anything else."""
    if is_speculators(info.config) and info.config.get(KIND_KEY) != "eagle3":
        kind = info.config.get(KIND_KEY)
        if kind in KINDS:
            return f"{KINDS[kind]} ({info.signal(KIND_KEY)}), which specsure does not run"
        return (f"a speculators-format head of a kind vLLM 0.33.0 does not register ({info.signal(KIND_KEY)}; it "
                f"registers {', '.join(KINDS)}), which specsure does not run; if it is an EAGLE-3 head, its "
                f"config.json should say \"{KIND_KEY}\": \"eagle3\"")
    if info.model_type not in FOREIGN_HEADS:
        return None
    return (f"{FOREIGN_HEADS[info.model_type]} ({info.signal('model_type')}), made for vLLM's method "
            f"{info.model_type!r} (earlier vLLM releases), which specsure does not run")


def deepseek_mtp_prefix(num_hidden_layers: int, module: int) -> str:
    """Where MTP module ``module`` lives in a DeepSeek-V3-layout checkpoint: right after the main layers."""
    return f"model.layers.{num_hidden_layers + module}."


OTHER_MTP_LAYOUTS: Final[tuple[tuple[str, str], ...]] = (
    ("mtp.", "Qwen3-Next and Qwen3.5"), ("mtp_layers.", "MiMo"), ("mtp_", "ERNIE 4.5"),  # mtp_block., mtp_emb_norm.
)
"""Where other families keep their MTP layers (a tensor-name part, at the start or after a dot), and who."""


def other_mtp_layout(names: Collection[str]) -> str:
    """A description of MTP layers stored in a layout other than DeepSeek-V3's (Qwen3-Next and
    Qwen3.5 keep theirs under ``mtp.``, MiMo under ``model.mtp_layers.N``, ERNIE 4.5 under
    ``mtp_block.N`` with ``mtp_emb_norm`` and others), or '' when none is seen."""
    for part, family in OTHER_MTP_LAYOUTS:
        found = sorted(n for n in names if n.startswith(part) or f".{part}" in n)
        if found:
            return (f"its MTP layers are stored in another layout ({len(found)} tensor{'s' * (len(found) > 1)} under {part!r}, such as "
                    f"{found[0]!r}, as {family} store{'s' if ' and ' not in family else ''} them), and specsure runs "
                    "MTP modules only in DeepSeek-V3's layout (model.layers.{num_hidden_layers + i}.eh_proj, enorm, "
                    "hnorm, shared_head) or as a standalone head")
    return ""


@dataclass(frozen=True)
class Evidence:
    """One signal about a field's value."""

    value: str
    """The value the signal points to (a method name)."""
    source: EvidenceSource
    signal: str
    """Where it came from, citable in a message: file and key, tensor, or path token."""


def classify_draft(info: CheckpointInfo) -> Evidence | None:
    """What method a draft/head checkpoint is made for, from its metadata; None if it says nothing."""
    if head := classify_head(info):
        return head
    archs = set(info.architectures)
    if (mtp := info.mtp_layers) and _stores_mtp(info):
        return Evidence("mtp", "checkpoint", info.signal(mtp[0]))
    if any(a.endswith(WHOLE_MODEL_SUFFIXES) for a in archs) and (info.num_hidden_layers or 0) >= 2:
        return Evidence("draft_model", "checkpoint",
                        f"{info.config_file or info.path} architectures={sorted(archs)}, "
                        f"{info.layer_count_key}={info.num_hidden_layers}")
    if any(a.endswith(WHOLE_MODEL_SUFFIXES) for a in archs) and WHOLE_MODEL_TENSOR in info.tensor_names:
        # one layer, but a whole model's embedding (a head names its own embed_tokens.weight)
        return Evidence("draft_model", "checkpoint",
                        f"{info.config_file or info.path} architectures={sorted(archs)}, tensor {WHOLE_MODEL_TENSOR}")
    if info.kind == "gguf" and info.num_hidden_layers:  # no head is a GGUF file: llama.cpp's are whole models
        return Evidence("draft_model", "checkpoint", f"{info.config_file} general.architecture="
                                                     f"{info.model_type}, block_count={info.num_hidden_layers}")
    return None


def _stores_mtp(info: CheckpointInfo) -> bool:
    """Whether the MTP modules a config declares are in its weights, as far as their headers were read.
    transformers writes num_nextn_predict_layers = 1 into every DeepSeek-V3 config it saves, with no
    MTP module in the weights; such a draft is a plain causal LM."""
    if not info.tensor_names or info.num_hidden_layers is None:
        return True  # nothing read to say otherwise (a config-only folder, a GGUF)
    return deepseek_mtp_prefix(info.num_hidden_layers, 0) + "eh_proj.weight" in info.tensor_names


def classify_head(info: CheckpointInfo) -> Evidence | None:
    """The head kind (eagle, eagle3, mtp) a checkpoint's metadata declares; None for anything else.

    These are the signals that mark a checkpoint as a head. A model's own MTP layer count and a
    whole causal LM are not among them, so a normal target (DeepSeek-V3, Llama) gives None.
    """
    archs = set(info.architectures)
    names = info.tensor_names
    where = info.config_file or info.path
    if is_speculators(info.config):  # its kind is the signal; the architectures are what vLLM derives from it
        kind = info.config.get(KIND_KEY)
        return Evidence("eagle3", "checkpoint", info.signal(KIND_KEY)) if kind == "eagle3" else None
    if hit := archs & EAGLE3_ARCHITECTURES:
        return Evidence("eagle3", "checkpoint", f"{where} architectures={sorted(hit)}")
    if hit := archs & EAGLE_ARCHITECTURES:
        return Evidence("eagle", "checkpoint", f"{where} architectures={sorted(hit)}")
    if hit := archs & MTP_HEAD_ARCHITECTURES:
        return Evidence("mtp", "checkpoint", f"{where} architectures={sorted(hit)}")
    if info.model_type in MTP_MODEL_TYPES:
        return Evidence("mtp", "checkpoint", info.signal("model_type"))
    if tensor := eagle3_tensor(names):
        return Evidence("eagle3", "checkpoint", f"tensor {tensor!r} in {info.path}")
    if info.config.get("draft_vocab_size") is not None:  # null is unset, as everywhere in config.json
        return Evidence("eagle3", "checkpoint", info.signal("draft_vocab_size"))
    if "fc.weight" in names:
        # Public EAGLE-1 heads often declare plain LlamaForCausalLM; their fc layer gives them away.
        return Evidence("eagle", "checkpoint", f"tensor 'fc.weight' in {info.path}")
    return None


def target_as_draft(info: CheckpointInfo) -> Evidence | None:
    """The target read as a draft (mtp without 'model'): head metadata, else a path hint.

    vLLM runs its method detection on the target then, so specsure reads the same checkpoint.
    A hint that agrees with the metadata is cited with it. The target's MTP layers are not head
    metadata, but they are metadata that agrees with mtp, so a path hint does not count against
    them (metadata first): a DeepSeek-V3 target that stores them gives None, whatever its folder
    is called (vLLM's own path rule is `export`'s and check-vllm's to flag).
    """
    head = classify_head(info)
    hint = path_hint(info.path) if head is not None or target_mtp(info) is None else None
    best = head or hint
    if best is None:
        return None
    signal = best.signal
    if head is not None and hint is not None and hint.value == head.value:
        signal += f" and {hint.signal}"
    return Evidence(best.value, best.source,
                    f"{signal}, read from the target because mtp without 'model' drafts with the target")


def eagle3_tensor(names: Collection[str]) -> str | None:
    """The first tensor name that only EAGLE-3 heads hold, or None."""
    return next((n for n in EAGLE3_TENSORS if n in names), None)


def target_mtp(info: CheckpointInfo) -> Evidence | None:
    """MTP modules declared by the target itself (DeepSeek-V3 layout and kin), and stored in its weights
    as far as their headers were read (see `_stores_mtp`)."""
    if (found := info.mtp_layers) and _stores_mtp(info):
        return Evidence("mtp", "checkpoint", info.signal(found[0]))
    return None


# English compounds that contain a hint token but name something else ("eagle-eye-7b" is a
# model called Eagle-Eye, not an EAGLE head). Matched as the neighbouring token ("eagle_eye" too).
COMPOUND_PARTNERS: Final[frozenset[str]] = frozenset({
    "eye", "eyes", "eyed", "scout", "scouts", "ray", "owl", "nest", "wing", "wings", "claw",
    "bald", "golden", "sea", "harpy", "steppe", "fish", "crested", "spotted", "white", "tailed",
})


def path_tokens(path: str) -> list[list[str]]:
    """Per last path component, its words (`_words`), in order."""
    parts = PurePath(path.rstrip("/\\")).parts[-PATH_COMPONENTS:]
    return [_joined_versions(_words(part)) for part in parts]


def _words(part: str) -> list[str]:
    """Lower-cased runs of letters and digits, any script's: 'éeagle' is one word, as 'myeagle' is, also
    when the accent is a separate combining character (macOS file names): NFC joins it first."""
    return [word for word in re.split(r"[\W_]+", unicodedata.normalize("NFC", part).lower()) if word]


def _joined_versions(tokens: list[str]) -> list[str]:
    """'eagle', '3' (as in EAGLE-3-LLaMA) reads as the one token 'eagle3'."""
    out: list[str] = []
    for tok in tokens:
        if tok == "3" and out and out[-1] == "eagle":
            out[-1] = "eagle3"
        else:
            out.append(tok)
    return out


def _compound(part: str, token: str) -> bool:
    """True when ``token`` sits next to a known compound partner in ``part``."""
    words = _joined_versions(_words(part))
    for i, word in enumerate(words):
        if word == token and ({words[i - 1] if i else "", words[i + 1] if i + 1 < len(words) else ""}
                              & COMPOUND_PARTNERS):
            return True
    return False


def path_hint(path: str) -> Evidence | None:
    """A method named by a whole token of the path; 'beagle', 'eagles', 'eagle-eye' name nothing.

    The path is read as its folder is named (`named_path`), so '~', '.' and '../x' hint as the
    spelled-out path to the same folder does."""
    named = named_path(path)
    parts = PurePath(named.rstrip("/\\")).parts[-PATH_COMPONENTS:]
    where = repr(path) if named == path else f"{path!r} ({named!r})"
    for token, method in PATH_HINTS:
        for part, tokens in zip(parts, path_tokens(named)):
            if token in tokens and not _compound(part, token):
                return Evidence(method, "path", f"path token {token!r} in {where}")
    return None


def _working_folder() -> str:
    """The working folder as the shell names it ($PWD, links kept, as `pwd` prints it) where that is
    the same folder as the process's own (getcwd, links resolved)."""
    shell = os.environ.get("PWD")
    try:
        if shell and os.path.isabs(shell) and os.path.samefile(shell, os.getcwd()):
            return shell
    except OSError:
        pass
    return os.getcwd()


def named_path(path: str) -> str:
    """``path`` with '~' expanded and '.' and '..' folded away; where only dots are left ('.', '..'),
    the absolute path, whose last component is the folder's name. Symbolic links stay as given: the
    name a user gave a link is theirs. Where '..' follows a link, the text's folding would name another
    folder than the one read, so the real path is used."""
    if not path:
        return path
    folded = os.path.normpath(os.path.expanduser(path))
    if os.path.basename(folded) in (".", ".."):
        return os.path.normpath(os.path.join(_working_folder(), folded))
    if folded == os.path.normpath(path) and "/." not in path:
        return path
    given = os.path.expanduser(path)
    parts = given.split(os.sep)
    if ".." in parts and os.path.exists(given) and not _same_folder(folded, given):
        # '..' after a link climbs from the link's target, not from the folder the text names: the
        # part up to the last '..' is named as the system resolves it, the rest as given.
        last = len(parts) - parts[::-1].index("..")
        return os.path.join(os.path.realpath(os.sep.join(parts[:last]) or os.sep), *parts[last:])
    return folded


def _same_folder(first: str, second: str) -> bool:
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False
