"""Benchmark workloads: JSONL prompt files and the built-in categories.

The schema (documented for users in bench/README.md) is one JSON object per line:

- ``category`` (string, required): the row's group in the report.
- exactly one of
  - ``prompt`` (non-empty string): rendered as one user turn with the tokenizer's chat
    template when the tokenizer has one, else encoded as-is;
  - ``messages`` (non-empty list of ``{"role", "content"}``, last turn from the user): a chat
    conversation, earlier assistant turns included, rendered with the chat template;
  - ``prompt_ids`` (non-empty list of non-negative ints): token ids used as-is, for models
    without a tokenizer.
- ``max_tokens`` (positive int, optional): overrides ``--max-tokens`` for this row.
- ``id`` (string, optional): defaults to ``<file stem>-<line>``.

Blank lines are skipped. Any other key is an error, so a typo never silently drops a field.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

CATEGORIES: tuple[str, ...] = ("chat", "translation", "summarization", "qa", "math", "code", "repeated_edit")
"""The built-in categories, in report order. A file's prompts run in file order, which matters for
'repeated_edit': successive edits of one file, where earlier answers help later ones."""

_KEYS = ("category", "prompt", "messages", "prompt_ids", "max_tokens", "id")
_INPUT_KEYS = ("prompt", "messages", "prompt_ids")
_ROLES = ("system", "user", "assistant")


class WorkloadError(ValueError):
    """A workload file breaks the schema; the message names the file, line and field."""


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt, as read from a workload file (not yet tokenized)."""

    id: str
    """Unique within a run; names the prompt in results.json."""
    category: str
    """The report group."""
    prompt: str | None = None
    """A plain-text request (one user turn)."""
    messages: tuple[tuple[str, str], ...] | None = None
    """Chat turns as (role, content) pairs; the last one is the user's."""
    prompt_ids: tuple[int, ...] | None = None
    """Token ids, used without a tokenizer."""
    max_tokens: int | None = None
    """Per-prompt cap on new tokens; None means the run's --max-tokens."""
    source: str = ""
    """`file:line` the prompt came from, for error messages."""


def default_workload_dir() -> Path:
    """The repository's bench/workloads folder (the source checkout, which `pip -e` uses)."""
    return Path(__file__).resolve().parents[3] / "bench" / "workloads"


def _fail(where: str, field: str | None, message: str) -> WorkloadError:
    """A schema error at ``where`` (file:line), naming ``field`` when there is one."""
    prefix = f"{where}: field {field!r}: " if field else f"{where}: "
    return WorkloadError(prefix + message + " (schema: bench/README.md)")


def _json(value: object) -> str:
    """``value`` as the file wrote it (true, null, "text"), not as Python prints it (True, None, 'text')."""
    return json.dumps(value, ensure_ascii=False)


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "true or false", int: "a number",
               float: "a number", type(None): "null"}


def _got(row: dict, key: str) -> str:
    """What a row holds at ``key``, for an error: the JSON value, or that the key is missing."""
    return f"got {_json(row[key])}" if key in row else "but the row has none"


def _parse_row(row: object, where: str, default_id: str) -> Prompt:
    if not isinstance(row, dict):
        raise _fail(where, None, f"expected a JSON object, got {_JSON_TYPES.get(type(row), type(row).__name__)}")
    for key in row:
        if key not in _KEYS:
            close = difflib.get_close_matches(str(key), _KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise _fail(where, key, f"unknown key; valid keys are {', '.join(_KEYS)}{hint}")
    category = row.get("category")
    if not isinstance(category, str) or not category.strip():
        raise _fail(where, "category", f"must be a non-empty string, {_got(row, 'category')}")
    if category != category.strip():  # " code" would be a category of its own beside "code"
        raise _fail(where, "category", f"{_json(category)} has spaces around it; write {_json(category.strip())}")
    given = [k for k in _INPUT_KEYS if k in row]
    if len(given) != 1:
        raise _fail(where, None, f"give exactly one of 'prompt', 'messages', 'prompt_ids'; got {given or 'none'}")
    prompt = messages = prompt_ids = None
    if "prompt" in row:
        prompt = row["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise _fail(where, "prompt", "must be a non-empty string")
    elif "messages" in row:
        messages = _parse_messages(row["messages"], where)
    else:
        ids = row["prompt_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise _fail(where, "prompt_ids", "must be a non-empty list of non-negative integers")
        prompt_ids = tuple(ids)
    max_tokens = row.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0):
        raise _fail(where, "max_tokens", f"must be a positive integer, got {_json(max_tokens)}")
    prompt_id = row.get("id", default_id)
    if not isinstance(prompt_id, str) or not prompt_id.strip() or prompt_id != prompt_id.strip():
        raise _fail(where, "id", f"must be a non-empty string without spaces around it, got {_json(prompt_id)}")
    return Prompt(prompt_id, category, prompt, messages, prompt_ids, max_tokens, where)


def _parse_messages(value: object, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise _fail(where, "messages", "must be a non-empty list of {role, content} objects")
    turns = []
    for i, turn in enumerate(value):
        field = f"messages[{i}]"
        if not isinstance(turn, dict) or set(turn) != {"role", "content"}:
            raise _fail(where, field, "must be an object with exactly the keys 'role' and 'content'")
        role, content = turn["role"], turn["content"]
        if role not in _ROLES:
            raise _fail(where, f"{field}.role", f"must be one of {', '.join(_ROLES)}, got {_json(role)}")
        if not isinstance(content, str) or not content.strip():
            raise _fail(where, f"{field}.content", "must be a non-empty string")
        turns.append((role, content))
    if turns[-1][0] != "user":
        raise _fail(where, "messages", f"the last turn must be the user's, got {_json(turns[-1][0])}")
    return tuple(turns)


def load_workloads(paths: Sequence[str | Path], *, unique: bool = True) -> list[Prompt]:
    """Read several workload files, in order. Files that share a stem (``a/chat.jsonl``,
    ``b/chat.jsonl``) get default ids with as much of their path as tells them apart (``a/chat-3``),
    so their rows stay apart. With ``unique`` (results keyed by id, as the bench's), an id still used
    twice is a WorkloadError naming both places; training reads rows, not ids, and passes False."""
    stems = [_id_stem(Path(p), [Path(q) for q in paths]) for p in paths]
    prompts = [prompt for path, stem in zip(paths, stems) for prompt in load_workload(path, stem)]
    if unique:
        _check_unique_ids(prompts, "give each prompt an \"id\" unique across the files, or pass a file once")
    return prompts


def _id_stem(path: Path, paths: Sequence[Path]) -> str | None:
    """None (the file's stem) unless another of ``paths`` has the same stem; then the shortest tail of
    the path (its suffix dropped, or kept where only the suffix differs) that no other file shares."""
    others = [q.resolve() for q in paths if q.stem == path.stem and q.resolve() != path.resolve()]
    if not others:
        return None
    real = path.resolve()

    def tail(file: Path, depth: int, keep_suffix: bool) -> str:  # `depth` folders, then the name
        return "/".join([*file.parts[-depth - 1:-1], file.name if keep_suffix else file.stem])

    for keep_suffix in (False, True):
        for depth in range(1, len(real.parts)):
            mine = tail(real, depth, keep_suffix)
            if all(tail(q, depth, keep_suffix) != mine for q in others):
                return mine
    return str(real)


def load_workload(path: str | Path, id_stem: str | None = None) -> list[Prompt]:
    """Read one JSONL workload file; a row without an id gets ``<id_stem>-<line>`` (by default the
    file's stem).

    Raises:
        WorkloadError: the file is missing, empty, not JSONL, or breaks the schema; the
            message names the file, the line and the field.
    """
    path = Path(path)
    id_stem = id_stem or path.stem
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()  # a leading BOM (Windows editors) is no text
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read workload file ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise WorkloadError(f"{path}:{line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); save the file as "
                            "UTF-8 (JSONL is UTF-8)") from None
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _fail(where, None, f"not valid JSON ({exc.msg} at column {exc.colno})") from exc
        prompts.append(_parse_row(row, where, f"{id_stem}-{number}"))
    if not prompts:
        raise WorkloadError(f"{path}: the workload file has no prompts")
    _check_unique_ids(prompts)
    return prompts


def load_builtin(categories: Sequence[str] = CATEGORIES, *, heldout: bool = False, folder: Path | None = None) -> list[Prompt]:
    """The built-in prompts of `categories` (the held-out split when `heldout`)."""
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise WorkloadError(f"unknown categories {unknown}; the built-in ones are {', '.join(CATEGORIES)}")
    folder = folder or default_workload_dir()
    if heldout:
        folder = folder / "heldout"
    if not folder.is_dir():
        raise WorkloadError(f"{folder}: built-in workloads not found (run from a source checkout, or pass --workload FILE.jsonl)")
    prompts = [p for c in categories for p in load_workload(folder / f"{c}.jsonl")]
    _check_unique_ids(prompts)
    return prompts


def select(prompts: Iterable[Prompt], categories: Sequence[str] | None, per_category: int | None) -> list[Prompt]:
    """Keep `categories` (all when None), and at most the first `per_category` of each."""
    kept: list[Prompt] = []
    counts: dict[str, int] = {}
    for p in prompts:
        if categories is not None and p.category not in categories:
            continue
        if per_category is not None and counts.get(p.category, 0) >= per_category:
            continue
        counts[p.category] = counts.get(p.category, 0) + 1
        kept.append(p)
    return kept


def _check_unique_ids(prompts: Sequence[Prompt], fix: str = "give the row its own \"id\"") -> None:
    seen: dict[str, str] = {}
    for p in prompts:
        if p.id in seen:  # results are keyed by id: two prompts would share one row
            raise _fail(p.source, "id", f"{_json(p.id)} is already used at {seen[p.id]}; {fix}")
        seen[p.id] = p.source


def encode(prompt: Prompt, tokenizer: object | None) -> tuple[int, ...]:
    """The token ids of `prompt`: chat-templated when the tokenizer has a template.

    A plain `prompt` becomes one user turn: instruction-tuned models (the default one) answer
    a bare string as text to continue, not as a request.

    Raises:
        WorkloadError: a text prompt and no tokenizer to encode it.
    """
    if prompt.prompt_ids is not None:
        return prompt.prompt_ids
    if tokenizer is None:
        raise WorkloadError(f"{prompt.source}: prompt {prompt.id!r} is text, but the model has no tokenizer; use 'prompt_ids'")
    turns = prompt.messages or (("user", prompt.prompt or ""),)
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": role, "content": content} for role, content in turns]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    elif prompt.messages is not None:  # roles would be dropped without a word: the run would not be the chat asked
        raise WorkloadError(f"{prompt.source}: prompt {prompt.id!r} gives 'messages', but the model's tokenizer has no "
                            "chat template to render them with; give the turns as one 'prompt' text, or use a model "
                            "whose tokenizer has a chat template.")
    else:
        ids = tokenizer.encode(prompt.prompt or "")
    return tuple(int(t) for t in ids)


def category_list(text: str | None) -> list[str] | None:
    """``--categories``: None when not given; a comma list of names otherwise, never empty (an empty
    one would quietly mean every category)."""
    if text is None:
        return None
    names = [name.strip() for name in text.split(",")]
    if not any(names) or "" in names:
        raise WorkloadError(f"--categories {text!r} {'names nothing' if not any(names) else 'has an empty item'}; "
                            f"give a comma list of categories, such as {','.join(CATEGORIES[:2])}, or leave the flag "
                            "out for all of them.")
    return names
