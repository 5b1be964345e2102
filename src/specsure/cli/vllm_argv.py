"""The command line as vLLM's parser reads it: underscores in flags, and a config's keys one by one.

vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py) takes ``--speculative_config`` for
``--speculative-config`` and merges ``--speculative-config.method ngram
--speculative-config.num_speculative_tokens 3`` into one JSON object, and users who move between
the two engines type both. specsure reads them the same way, with one difference: where vLLM
keeps the last of two values and logs a line, a config key given twice, or the config or the model
flag given twice, is an error naming both values, since the first would be an explicit value dropped.
So is a whole JSON object beside keys given one by one: vLLM keeps the keys and drops the object.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any, Sequence

from specsure.cli.common import parse_speculative_config
from specsure.config.errors import ConfigError

SPEC_FLAGS = ("--speculative-config", "-sc")
"""vLLM's long and short spellings of the flag."""
SHORT_FLAGS = {"--spec-method": "method", "--spec-model": "model", "--spec-tokens": "num_speculative_tokens"}
"""vLLM 0.33's shorthand flags and the speculative-config key each sets (vllm/engine/arg_utils.py)."""


def normalise(argv: Sequence[str]) -> list[str]:
    """``argv`` with vLLM's spellings turned into specsure's: flags' underscores as dashes, and every
    ``--speculative-config.KEY VALUE`` merged into the one ``--speculative-config`` JSON object.

    Words after a bare ``--`` are left as they are. Raises ConfigError (a ValueError) for a key
    given twice, or given both one by one and in the JSON.
    """
    words: list[str] = []
    keys: dict[str, Any] = {}
    typed: dict[str, str] = {}  # each top-level key: the flag that gave it, as the user spelled it
    tail: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            tail = list(argv[i:])
            break
        if word.startswith("--") and _flag_word(word):
            name, eq, value = word.partition("=")
            flag, dot, path = name.partition(".")
            word = flag.replace("_", "-") + dot + path + eq + value
        name, eq, value = word.partition("=")
        flag, dot, path = name.partition(".")
        short = SHORT_FLAGS.get(name)
        if short is None and not (dot and flag in SPEC_FLAGS):
            words.append(word)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1] == "--":
                raise ConfigError(f"{name} needs a value ({name} VALUE, or {name}=VALUE).")
            value = argv[i + 1]
            i += 1
        i += 1
        if short is not None:  # vLLM reads these as the config's key, typed as the key's own type
            path, parsed = short, (_int_or_text(value) if short == "num_speculative_tokens" else value)
            if short == "num_speculative_tokens" and not isinstance(parsed, int):
                raise ConfigError(f"{name} {value!r}: must be an integer, the number of draft tokens a step "
                                  f"(num_speculative_tokens), as in {name} 3.")
        elif not path or "" in path.split("."):
            raise ConfigError(f"{name}: name a key after the dot, as in --speculative-config.method ngram.")
        else:
            parsed = _value(path, value)
        top = path.rstrip("+").split(".")[0]
        _put(keys, path, parsed, name, typed.get(top))
        typed.setdefault(top, name)
    if keys:
        words = _merged(words, keys, typed)
    return words + tail


def repeated_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """(the error for a configuring flag given twice, or None; a note for each other flag given twice).

    argparse keeps the last value. For ``--speculative-config`` and ``--model`` that would drop an
    explicit config, so two different values are an error (the same one twice drops nothing); any
    other flag keeps its last value, as in argparse and vLLM (a wrapper script may set a default that
    the user overrides), with a note. Flags that may repeat
    (``--workload``) append instead and are not counted.
    """
    seen: dict[str, tuple[str, str]] = {}
    notes: list[str] = []
    for index, word in enumerate(argv):
        if word == "--":
            break
        name, eq, value = word.partition("=")
        action = parser._option_string_actions.get(name)
        if not isinstance(action, argparse._StoreAction):
            continue
        if not eq:
            value = argv[index + 1] if index + 1 < len(argv) else ""
        if action.dest in seen:
            first, before = seen[action.dest]
            if action.dest in SECRET:  # never echoed, and an error: the first key would stop opening the server
                return (f"{name} is given twice; argparse would keep the last key only. Give every key after one "
                        f"{name} (it takes several).", notes)
            if value == before and action.nargs is None:  # nothing is dropped (a flag of several values may be)
                notes.append(f"note: {name} is given twice with the same value, {value!r}.")
            elif action.dest in CONFIGURING:
                return (f"{name} is given twice ({first} {before!r}, then {name} {value!r}); the first would be "
                        "dropped without a word. Give it once.", notes)
            elif action.nargs is not None:  # only its first value was read here
                notes.append(f"note: {name} is given twice; the last one's values are used.")
            else:
                notes.append(f"note: {name} is given twice; the last, {value!r}, is used.")
        seen[action.dest] = (name, value)
    return None, notes


CONFIGURING = frozenset({"speculative_config", "model"})
"""The destinations whose second value would silently replace an explicit configuration."""
SECRET = frozenset({"api_key"})
"""Destinations whose values never appear in a message."""


def _value(path: str, text: str) -> Any:
    """A dotted key's value as vLLM reads it: JSON where it parses, else an integer with a size suffix
    (``10k`` 10,000, ``1K`` 1,024: vLLM's human_readable_int), else the text; ``KEY+`` a list."""
    if path.endswith("+"):
        return text.split(",")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text.strip())
    if match is None:
        return text
    number, suffix = match.groups()
    if suffix.islower():
        return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
    return int(number) * 2 ** (10 * "KMGT".index(suffix) + 10) if number.isdigit() else text


def _flag_word(word: str) -> bool:
    """Whether a word starting with -- is a flag to read vLLM's way. A word with a space is a value
    (argparse reads it so; "--batch_size=4 is what?" is a prompt), except the speculative config's
    own flags, whose value after '=' may hold one (a draft in "/models/beagle qwen")."""
    if " " not in word:
        return True
    name = word.partition("=")[0]
    if " " in name:
        return False
    flag = name.partition(".")[0].replace("_", "-")
    return flag in SPEC_FLAGS or flag in SHORT_FLAGS


def _int_or_text(text: str) -> Any:
    try:
        return int(text)
    except ValueError:  # resolution names the key and the value
        return text


def _put(keys: dict[str, Any], path: str, value: Any, name: str, before: str | None) -> None:
    """Set the dotted key ``path`` that flag ``name`` gave; ``before``: the flag that gave its top key first."""
    *parents, last = path.rstrip("+").split(".")
    node = keys
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{name}: {part!r} is given a value of its own as well as keys under it; give one.")
    if last in node and path.endswith("+") and isinstance(node[last], list):
        node[last] += value  # KEY+ appends, as vLLM's parser does
        return
    if last in node:
        twice = f"{name} is given twice" if before in (None, name) else f"{before} and {name} both give it"
        raise ConfigError(f"{twice} ({json.dumps(node[last])} and {json.dumps(value)}); keep the one you mean.")
    node[last] = value


def _merged(words: list[str], keys: dict[str, Any], typed: dict[str, str]) -> list[str]:
    """``words`` with one ``--speculative-config`` holding the JSON given whole (if any) and ``keys``,
    each top-level key given by the flag ``typed`` names."""
    at = [i for i, w in enumerate(words) if w.partition("=")[0] in SPEC_FLAGS]
    if not at:
        return [*words, SPEC_FLAGS[0], json.dumps(keys)]
    index = at[0]
    flag, eq, text = words[index].partition("=")
    end = index + 1
    if not eq:
        text = words[index + 1] if index + 1 < len(words) else ""
        end = index + 2
    whole = parse_speculative_config(text, flag) if text.strip() else None  # the keys given one by one may set it
    dotted = sorted(typed[key] for key in keys if "." in typed[key])
    if whole is not None and dotted:  # vLLM's shorthands (--spec-tokens) merge with it; dotted keys do not
        raise ConfigError(
            f"{flag} gives a whole JSON object and {dotted[0]} a key one by one. vLLM 0.33.0 reads the keys given "
            f"one by one as a second {SPEC_FLAGS[0]} and keeps only that one, so it would drop "
            f"{json.dumps(whole)} without a word. Put every key in the one JSON object, or give them all one by one.")
    whole = whole or {}
    if both := sorted(set(whole) & set(keys)):
        key = both[0]
        raise ConfigError(f"{key!r} is given both in {flag} ({json.dumps(whole[key])}) and by {typed[key]} "
                          f"({json.dumps(keys[key])}); keep the one you mean.")
    return [*words[:index], flag, json.dumps({**whole, **keys}), *words[end:]]
