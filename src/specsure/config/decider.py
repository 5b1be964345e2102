"""The per-field decisions of one resolve() call: method, model, token tree and k, with their reasons.

resolution.py runs them in order and builds the Resolution; the evidence they weigh comes from
detect.py, and an explicit value always wins (docs/architecture.md, "Resolution rules").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Mapping

from specsure.config.checkpoint import CheckpointInfo, read_checkpoint
from specsure.config.compat import FOREIGN_FIX
from specsure.config.decision import Decision
from specsure.config.detect import (
    WHAT_IS, Evidence, classify_draft, foreign_head, other_mtp_layout, path_hint, target_as_draft, target_mtp,
)
from specsure.config.errors import ConfigError
from specsure.config.schema import MAX_SPECULATIVE_TOKENS, METHODS, SUFFIX_FIELDS
from specsure.config.user_spec import UNSET, UserSpec
from specsure.config.shipped import shipped_head, shipped_tree
from specsure.config.speculators import declared_k
from specsure.config.token_tree import TREE_METHODS, DraftTree, tree_shape

DEFAULT_NUM_SPECULATIVE_TOKENS: Final[Mapping[str, int]] = MappingProxyType(
    {"ngram": 5, "draft_model": 4, "eagle": 5, "eagle3": 5, "mtp": 1})


def _method_for(path: str) -> str:
    """The fix for a method that takes no draft: the method the checkpoint's metadata names, if any."""
    try:
        evidence = classify_draft(read_draft(path))
    except ConfigError:
        evidence = None
    if evidence is None or evidence.value == "draft_model":
        return "choose method 'draft_model' to draft with it"
    return (f"choose method {evidence.value!r} to draft with it (its metadata marks it as {WHAT_IS[evidence.value]}: "
            f"{evidence.signal})")


def read_draft(path: str) -> CheckpointInfo:
    try:
        return read_checkpoint(path)
    except ConfigError as exc:
        raise ConfigError(f"model (the draft checkpoint): {exc}") from None


def _checkpoint_k(count: int, reason: str) -> Decision:
    """k read from a checkpoint; a count above the schema's ceiling is capped, and the reason says so."""
    if count > MAX_SPECULATIVE_TOKENS:
        reason += f" That is above the maximum, so k is capped at {MAX_SPECULATIVE_TOKENS}."
        count = MAX_SPECULATIVE_TOKENS
    return Decision("num_speculative_tokens", count, "checkpoint", reason)


@dataclass
class Decider:
    """The working state of one resolve() call, and its per-field decisions; never escapes it."""

    spec: UserSpec
    target: CheckpointInfo
    target_head: Evidence | None = None
    draft: CheckpointInfo | None = None
    draft_evidence: Evidence | None = None
    default_target: bool = False
    """The target is the packaged default model, for which specsure ships heads."""
    shipped_tree: DraftTree | None = None
    """The tree the shipped head drafts by default, once `shipped` chose it."""
    shipped_tree_why: str = ""
    """Why that tree, for this run (shipped.py)."""
    dtype: str | None = "auto"
    """The dtype the run loads in, or None for an export (`resolve`)."""
    notices: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    """The same disagreements as strict mode words them: no value is kept, and each says how to agree."""

    def conflict(self, name: str, user: Any, detected: Any, signal: str) -> None:
        self.conflicts.append(
            f"{name}: you set {user!r}, but the evidence suggests {detected!r} (signal: {signal}). "
            f"Keeping your value {user!r}.")
        self.refusals.append(
            f"{name}: you set {user!r}, but the evidence suggests {detected!r} (signal: {signal}). Make them agree "
            f"(set {name} to {detected!r}, or give a checkpoint that says {user!r}), or leave strict off to keep "
            f"{user!r} with a warning.")

    def method_evidence(self) -> Evidence | None:
        """Evidence from the draft: its metadata, else a path hint (target MTP layers: decide_method).

        A user's mtp without a draft drafts with the target, so the target is read as the draft;
        on the default target, whose mtp drafts with the shipped head (`shipped`), the head is.
        """
        if self.draft is not None:
            return self.draft_evidence or path_hint(self.spec.model)
        if self.spec.method == "mtp" and self.spec.model is UNSET and self.default_target \
                and target_mtp(self.target) is None and (head := shipped_head("mtp")) is not None:
            return classify_draft(read_draft(head))
        if self.spec.method == "mtp":
            return target_as_draft(self.target)
        return None

    def decide_method(self) -> Decision:
        user = self.spec.method
        evidence = self.method_evidence()
        if user is not UNSET:
            if evidence is not None and evidence.value != user:
                self.conflict("method", user, evidence.value, evidence.signal)
            how = f" (written as the alias {self.spec.method_alias!r})" if self.spec.method_alias else ""
            if self.spec.ngram_spelling:
                how = f" (written as vLLM's older {self.spec.ngram_spelling})"
            return Decision("method", user, "user", f"You set method {user!r}{how}; it is never replaced.")
        if evidence is not None:
            if evidence.source == "checkpoint":
                why = f"Detected from checkpoint metadata: the draft is {WHAT_IS[evidence.value]} ({evidence.signal})."
            else:
                why = f"Detected from a whole-token path hint: {evidence.signal}; the draft's metadata says nothing."
            return Decision("method", evidence.value, evidence.source, why)
        if self.draft is not None and (foreign := foreign_head(self.draft)):
            raise ConfigError(f"method is not set, and the draft checkpoint {self.spec.model!r} is {foreign}. "
                              f"{FOREIGN_FIX}")
        if self.draft is not None:
            return Decision("method", "draft_model", "default",
                            "A draft checkpoint was given and nothing in its metadata or path marks it as a "
                            "head, so it runs as an independent draft model.")
        head = self.target_head
        if (mtp := target_mtp(self.target)) and (head is None or head.value == "mtp"):
            return Decision("method", "mtp", "checkpoint",
                            f"No draft was given and the target declares MTP layers ({mtp.signal}).")
        lookup = [n for n in ("prompt_lookup_min", "prompt_lookup_max", "prompt_lookup_branches")
                  if getattr(self.spec, n) is not UNSET]
        suffix = [n for n in SUFFIX_FIELDS if getattr(self.spec, n) is not UNSET]
        if lookup and suffix:
            raise ConfigError(
                f"method is not set, and {', '.join(lookup)} (ngram's) and {', '.join(suffix)} (suffix's) were "
                "both given; no method reads both. Set method 'ngram' or 'suffix', and drop the other's keys.")
        if lookup:
            return Decision("method", "ngram", "derived",
                            f"{', '.join(lookup)} {'was' if len(lookup) == 1 else 'were'} given, and only ngram "
                            f"uses {'it' if len(lookup) == 1 else 'them'}.")
        if suffix:
            return Decision("method", "suffix", "derived",
                            f"{', '.join(suffix)} {'was' if len(suffix) == 1 else 'were'} given, and only suffix "
                            f"decoding uses {'it' if len(suffix) == 1 else 'them'}.")
        if head is not None:
            # A head cannot be the target, so neither its kind nor its MTP layer count fills the method.
            raise ConfigError(
                f"method is not set, no draft 'model' was given, and the target {self.target.path!r} is itself "
                f"{WHAT_IS[head.value]} ({head.signal}), which drafts for a target and cannot serve as one. "
                f"Give the model it was trained for as the target, and this checkpoint as 'model' "
                f"(method {head.value!r}).")
        raise ConfigError(
            "method is not set and there is nothing to detect it from (no draft 'model', and the target "
            f"holds no MTP layers{_unstored_mtp(self.target)}). Set method to one of {', '.join(METHODS)}, for example "
            '{"method": "ngram", "num_speculative_tokens": 4}.')

    def decide_model(self, method: str) -> Decision:
        user = self.spec.model
        target_layers = target_mtp(self.target)
        if user is None:
            return self.explicit_no_draft(method, target_layers)
        if user is not UNSET:
            if method == "ngram":
                raise ConfigError(f"model = {user!r} is not used by method 'ngram' (it drafts from the context). "
                                  f"Remove 'model', or {_method_for(user)}.")
            if method == "suffix":
                raise ConfigError(f"model = {user!r} is not used by method 'suffix' (it drafts from suffix trees of "
                                  f"the context and of earlier outputs). Remove 'model', or {_method_for(user)}.")
            if method == "mtp" and target_layers is not None:
                said = (f"model: you set {user!r}, but the target declares its own MTP layers "
                        f"(signal: {target_layers.signal}), which mtp uses when no model is given.")
                self.conflicts.append(f"{said} Keeping your value {user!r}.")
                self.refusals.append(f"{said} Leave 'model' out to draft with the target's MTP layers, or leave "
                                     f"strict off to keep {user!r} with a warning.")
            return Decision("model", user, "user", "You set the draft checkpoint; detection never replaces it."
                            + self.draft_description())
        if method == "ngram":
            return Decision("model", None, "derived", "ngram drafts by prompt lookup and needs no draft model.")
        if method == "suffix":
            return Decision("model", None, "derived", "suffix drafts from suffix trees over this request's tokens "
                                                      "and earlier outputs, and needs no draft model.")
        if (shipped := self.shipped(method, target_layers)) is not None:
            return shipped
        if method == "mtp":
            found = (f"the target declares them ({target_layers.signal})" if target_layers
                     else f"but the target holds none{_unstored_mtp(self.target)}, so the engine cannot start without "
                          "a head")
            return Decision("model", None, "derived", f"mtp without 'model' uses the MTP layers inside the target; {found}.")
        need = {"draft_model": "a smaller causal LM with the target's vocabulary",
                "eagle": "an EAGLE-1 head", "eagle3": "an EAGLE-3 head"}[method]
        raise ConfigError(f"method {method!r} needs 'model': the path of {need}. Add \"model\": \"/path/to/checkpoint\".")

    def shipped(self, method: str, target_layers: Evidence | None) -> Decision | None:
        """The head shipped for the default target, when ``model`` is unset (mtp: and the target has no MTP layers)."""
        if not self.default_target or (method == "mtp" and target_layers is not None):
            return None
        path = shipped_head(method)
        if path is None:
            return None
        self.draft = read_draft(path)
        self.draft_evidence = classify_draft(self.draft)
        self.shipped_tree, self.shipped_tree_why = shipped_tree(method, self.dtype)
        return Decision("model", path, "default",
                        f"No draft 'model' was given and the target is the packaged default, so the {method} head "
                        "shipped with specsure for it is used (trained by `make heads`, docs/training.md)."
                        + self.draft_description())

    def explicit_no_draft(self, method: str, target_layers: Evidence | None) -> Decision:
        """``"model": null``: the user said there is no separate draft checkpoint."""
        if method in ("draft_model", "eagle", "eagle3"):
            raise ConfigError(f"model = null, but method {method!r} needs a draft checkpoint. Give \"model\": "
                              "\"/path/to/checkpoint\", or choose method 'ngram'.")
        why = "You set model to null (no separate draft)"
        if method == "mtp":
            where = (f"the target declares them ({target_layers.signal})" if target_layers
                     else f"the target holds none{_unstored_mtp(self.target)}")
            return Decision("model", None, "user", f"{why}; mtp then uses the MTP layers inside the target, and {where}.")
        if method == "suffix":
            return Decision("model", None, "user", f"{why}; suffix drafts from suffix trees and needs none.")
        return Decision("model", None, "user", f"{why}; ngram drafts by prompt lookup and needs none.")

    def draft_description(self) -> str:
        """What the draft's metadata says it is, for the model row of explain."""
        evidence = self.draft_evidence
        if evidence is None and self.draft is not None and (foreign := foreign_head(self.draft)):
            return f" Its metadata marks it as {foreign}."
        if evidence is None:
            return " Its metadata does not say what kind of draft it is."
        return f" Its metadata marks it as {WHAT_IS[evidence.value]} ({evidence.signal})."

    def decide_tree(self, method: str) -> Decision:
        name, tree, shipped = "speculative_token_tree", self.spec.speculative_token_tree, self.shipped_tree
        k_given = self.spec.num_speculative_tokens is not UNSET
        if method not in TREE_METHODS:
            if tree is not UNSET:
                other = {"ngram": " (ngram's own tree is prompt_lookup_branches)",
                         "suffix": " (suffix builds its own tree from the suffix trees)"}.get(method, "")
                raise ConfigError(f"{name} applies only to methods {', '.join(TREE_METHODS)}, which draft with a "
                                  f"head, but the method is {method!r}{other}. Remove {name}.")
            return Decision(name, None, "derived",
                            f"Only a head's drafts form a static tree; the method is {method!r}.")
        if tree is UNSET and shipped is not None and not k_given:
            return Decision(name, shipped, "default", f"The shipped {method} head drafts this tree unless you set "
                                                      f"num_speculative_tokens or a tree: {self.shipped_tree_why} "
                                                      f"(BENCHMARKS.md); {tree_shape(shipped)}.")
        if tree is UNSET:
            chain = "You set num_speculative_tokens, so" if k_given and shipped is not None else "None:"
            return Decision(name, None, "default", f"{chain} the draft is a chain of num_speculative_tokens tokens, "
                                                   "as vLLM drafts.")
        return Decision(name, tree, "user", f"You set the draft tree: {tree_shape(tree)}.")

    def _declared_k(self, needed: bool) -> tuple[str, int] | None:
        """(key, value) of the draft length the draft declares: an MLP speculator's n_predict, or the
        speculative_tokens a speculators-format head was trained for."""
        if self.draft is None:
            return None
        if n_predict := self.draft.int_field("n_predict"):
            return "n_predict", n_predict
        if n_predict == 0 and needed:  # vLLM would take it as k and draft nothing
            raise ConfigError(f"num_speculative_tokens is not set, and the draft declares no draft tokens "
                              f"({self.draft.signal('n_predict')}). Set num_speculative_tokens, or fix n_predict in "
                              "the draft's config.json.")
        return declared_k(self.draft.config, self.draft.config_file or self.draft.path, needed)

    def decide_num_tokens(self, method: str, tree_depth: int | None, token_tree: DraftTree | None) -> Decision:
        user = self.spec.num_speculative_tokens
        declared = self._declared_k(needed=user is UNSET and token_tree is None)  # it would fill k
        if token_tree is not None:  # both explicit: they must agree, and neither replaces the other
            if user is not UNSET and user != len(token_tree):
                raise ConfigError(f"num_speculative_tokens = {user} but speculative_token_tree has {len(token_tree)} "
                                  "nodes, and every node is a draft token. Set "
                                  f"num_speculative_tokens to {len(token_tree)}, or leave it out.")
            if user is not UNSET:
                return Decision("num_speculative_tokens", user, "user", "You set num_speculative_tokens; it equals "
                                                                        "the node count of your tree.")
            nodes = f"{len(token_tree)} node{'s' * (len(token_tree) > 1)}"
            return Decision("num_speculative_tokens", len(token_tree), "derived",
                            f"speculative_token_tree has {nodes}, and every node is a draft token.")
        if user is not UNSET:
            if declared and declared[1] != user:
                self.conflict("num_speculative_tokens", user, declared[1], self.draft.signal(declared[0]))
            return Decision("num_speculative_tokens", user, "user", "You set num_speculative_tokens.")
        if declared:
            return _checkpoint_k(declared[1], f"The draft declares how many tokens it predicts "
                                              f"({self.draft.signal(declared[0])}).")
        if method == "mtp":
            holder = self.draft if self.draft is not None else self.target
            if (layers := holder.mtp_layers) is not None:
                return _checkpoint_k(layers[1], f"One draft token per MTP module ({holder.signal(layers[0])}).")
        if method == "suffix":
            assert tree_depth is not None
            why = (f"suffix without num_speculative_tokens drafts up to the tree depth (vLLM's rule): "
                   f"suffix_decoding_max_tree_depth = {tree_depth}.")
            if tree_depth > MAX_SPECULATIVE_TOKENS:
                why += f" That is above the maximum, so k is capped at {MAX_SPECULATIVE_TOKENS}."
            return Decision("num_speculative_tokens", min(tree_depth, MAX_SPECULATIVE_TOKENS), "derived", why)
        value = DEFAULT_NUM_SPECULATIVE_TOKENS[method]
        return Decision("num_speculative_tokens", value, "default", f"The default k for {method} is {value}.")


def _unstored_mtp(target: CheckpointInfo) -> str:
    """Why a target whose config declares MTP modules does not count as holding them, or ''."""
    if target.mtp_layers is None:
        return ""
    if layout := other_mtp_layout(target.tensor_names):
        return f": {target.signal(target.mtp_layers[0])} declares some, but {layout}"
    return f": {target.signal(target.mtp_layers[0])} declares some, but its weights store none"
