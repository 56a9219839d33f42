"""Errors raised for bad user input: one sentence naming the field, file or line.

`format_validation_error` turns pydantic's report into that sentence: the field's path as the
user wrote it (union member labels such as `int`, `literal['all']` or a discriminator's tag
dropped), then what was expected and what was given, e.g. "engine.scheduling_policy: expected
one of fcfs, priority (got 'lifo')"."""

from __future__ import annotations

import json
import math
import re
import types
import typing
from typing import Any

from pydantic import BaseModel, BeforeValidator, ValidationError
from pydantic_core import PydanticCustomError


class ConfigError(ValueError):
    """A configuration, scenario or data file is invalid; the message names where and why."""


_LEADING_FIELD = re.compile(r"([a-z_][a-z0-9_]*): ")
_MAX_SHOWN_CHARS = 60
_KIND_OF_LABEL = {"int": "a whole number", "float": "a number", "str": "text",
                  "bool": "true/false", "none": "null"}
_NUMBER_BOUNDS = {"greater_than": ("greater than", "gt"),
                  "greater_than_equal": ("at least", "ge"),
                  "less_than": ("less than", "lt"),
                  "less_than_equal": ("at most", "le"),
                  "multiple_of": ("a multiple of", "multiple_of")}
_EXPECTED = {
    "int_type": "a whole number", "int_parsing": "a whole number",
    "int_from_float": "a whole number", "float_type": "a number", "float_parsing": "a number",
    "bool_type": "true or false", "bool_parsing": "true or false", "string_type": "text",
    "list_type": "a list", "tuple_type": "a list", "set_type": "a list",
    "dict_type": "a mapping", "model_type": "a mapping of settings",
    "model_attributes_type": "a mapping of settings",
    "path_type": "a file path", "finite_number": "a finite number", "none_required": "null",
}


def show(value: Any) -> str:
    """A value as the user would have written it in YAML, shortened."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, default=str)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= _MAX_SHOWN_CHARS else text[:_MAX_SHOWN_CHARS - 3] + "..."


def _refusing_true_or_false(kind: str, expected: str) -> BeforeValidator:
    """A validator that refuses YAML's true and false with pydantic's `kind` of type error."""
    def not_true_or_false(value: Any) -> Any:
        if isinstance(value, bool):
            raise PydanticCustomError(kind, f"Input should be a valid {expected}")
        return value
    return BeforeValidator(not_true_or_false)


WholeNumber = typing.Annotated[int, _refusing_true_or_false("int_type", "integer")]
"""An int field that refuses YAML's true and false, which pydantic would read as 1 and 0."""

Number = typing.Annotated[float, _refusing_true_or_false("float_type", "number")]
"""A float field that refuses YAML's true and false, which pydantic would read as 1.0 and 0.0;
numbers, numeric text and infinities read as a float field reads them."""


def away_from_default(model: BaseModel, *names: str) -> list[str]:
    """The fields of `names` whose values in `model` differ from their defaults: the settings a
    check of settings with no effect refuses. Against the defaults, not the fields given, so
    that a config written out whole (every field, defaults included) reads back."""
    fields = type(model).model_fields
    return [n for n in names
            if getattr(model, n) != fields[n].get_default(call_default_factory=True)]


def format_validation_error(err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """The first error of `err` as one sentence, "PATH: what was wrong"; `model` (the class that
    was validated) lets the path drop the tags of discriminated unions and place unknown keys."""
    return _format(err.errors(include_url=False), model, frozenset())


def _format(errors: list[dict], model: type[BaseModel] | None, resolved: frozenset[int]) -> str:
    """`resolved`: indices in the locations of union member labels already accounted for."""
    e = errors[0]
    path = _Path.of(model, e["loc"], resolved)
    if path.union_at is not None:
        # The input matched none of a union's members: each member reported its own error.
        # One that got past the member's type (a list's item, a validator, a number out of
        # its member's range) is the closest.
        prefix = e["loc"][:path.union_at]
        group = [x for x in errors if x["loc"][:path.union_at] == prefix
                 and len(x["loc"]) > path.union_at]
        inner = [x for x in group if len(x["loc"]) > path.union_at + 1
                 or x["type"] in ("value_error", "assertion_error", "finite_number")
                 or x["type"] in _NUMBER_BOUNDS]
        if inner:
            return _format(inner, model, resolved | {path.union_at})
        labels = dict.fromkeys(str(x["loc"][path.union_at]) for x in group)
        kinds = _join([_label_kind(label) for label in labels])
        return f"{path.text}: expected {kinds} (got {show(e['input'])})"
    return _sentence(e, path, model)


def _custom_message(e: dict) -> str:
    msg = e["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return msg


def _sentence(e: dict, path: "_Path", model: type[BaseModel] | None) -> str:
    kind, ctx, got = e["type"], e.get("ctx") or {}, show(e["input"])
    where = path.text
    if kind == "missing":
        if path.tuple_length is not None:
            return f"{path.parent_text}: expected a list of {path.tuple_length} values"
        return f"{where}: is required"
    if kind == "extra_forbidden":
        return f"{where}: {_unknown_key(model, path)}"
    if kind in ("value_error", "assertion_error"):
        msg = _custom_message(e)
        field = _LEADING_FIELD.match(msg)
        if field and where:         # a section's check naming its field: "engine.block_size: ..."
            return f"{where}.{field.group(1)}: {msg[field.end():]}"
        return f"{where}: {msg}" if where else msg
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        key = f"{where}.{ctx.get('discriminator', 'kind').strip(chr(39))}".lstrip(".")
        tags = _choices(tuple(t.strip().strip("'") for t in ctx["expected_tags"].split(","))
                        if "expected_tags" in ctx else tuple(path.tags))
        if kind == "union_tag_not_found":
            return f"{key}: is required ({tags})"
        name, given = key.rsplit(".", 1)[-1], e["input"]
        got = show(given[name]) if isinstance(given, dict) and name in given else ctx.get("tag")
        return f"{key}: expected {tags} (got {got})"
    if kind in ("literal_error", "enum"):
        what = f"expected {_choices(path.choices) if path.choices else ctx.get('expected')}"
    elif kind in _NUMBER_BOUNDS:
        words, key = _NUMBER_BOUNDS[kind]
        bound = ctx.get(key)
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return f"{where}: must be {words} {show(bound)} (got {got})"
    elif kind in ("too_short", "too_long", "string_too_short", "string_too_long"):
        return f"{where}: {_length(kind, ctx)} (got {got})"
    elif kind in _EXPECTED:
        what = f"expected {_EXPECTED[kind]}"
    else:
        msg = e["msg"]
        what = ("expected " + msg.removeprefix("Input should be ").removeprefix("a valid ")
                if msg.startswith("Input should be ") else msg[:1].lower() + msg[1:])
    if path.key_error:
        return f"{where}: each key must be {what.removeprefix('expected ')} (got {got})"
    return f"{where}: {what} (got {got})"


def _choices(values: tuple) -> str:
    if len(values) == 1:
        return show(values[0])
    return "one of " + ", ".join(str(v) for v in values)


def _length(kind: str, ctx: dict) -> str:
    if kind == "string_too_short":
        n = ctx.get("min_length", 1)
        return "must not be empty" if n == 1 else f"needs at least {n} characters"
    if kind == "string_too_long":
        return f"takes at most {ctx.get('max_length')} characters"
    if kind == "too_short":
        n = ctx.get("min_length", 1)
        return f"needs at least {n} item{'s' if n != 1 else ''}"
    n = ctx.get("max_length")
    return f"takes at most {n} item{'s' if n != 1 else ''}"


def _join(words: list[str]) -> str:
    """"a", "a or b", "a, b or c"."""
    if len(words) <= 1:
        return "".join(words)
    return f"{', '.join(words[:-1])} or {words[-1]}"


def _label_kind(label: str) -> str:
    """What a union member accepts, from pydantic's label for it."""
    if label.startswith("function-") and "," in label:
        label = label[label.rindex(",") + 1:].rstrip("]").strip()
    label = label.removeprefix("constrained-")     # a number with bounds: "constrained-float"
    if label in _KIND_OF_LABEL:
        return _KIND_OF_LABEL[label]
    if label.startswith("literal["):
        return _join([v.strip() for v in label[len("literal["):-1].split(",")])
    if label.startswith(("list[", "tuple[", "set[", "frozenset[")):
        return "a list"
    if label.startswith("dict["):
        return "a mapping"
    if label[:1].isupper():
        return "a mapping of settings"
    return label


NOT_MODELLED = "not_modelled"
"""Key of a field's `json_schema_extra` naming a vLLM feature the simulator refuses (e.g.
"LoRA"): the field exists so that the refusal can name it, also when the key
is given in the wrong place."""


def _unknown_key(model: type[BaseModel] | None, path: "_Path") -> str:
    key = str(path.parts[-1]) if path.parts else ""
    here = path_text(path.parts[:-1])
    places = [(p, info) for p, info in (_field_paths(model, key) if model else [])
              if p != path.text]
    for place, info in places:
        what = (info.json_schema_extra or {}).get(NOT_MODELLED) \
            if isinstance(info.json_schema_extra, dict) else None
        if what:
            role = "an engine argument" if place.startswith("engine.") else "a setting"
            return f"{what} is not modelled yet (in vLLM it is {role}, `{place}`)"
    if places:
        names = [p for p, _ in places[:3]]
        sections = _join([f"{p.rsplit('.', 1)[0]}:" if "." in p else "the top level"
                          for p in names])
        return (f"is not a setting {'of ' + here if here else 'at the top level'}; it belongs "
                f"{'under ' if '.' in names[0] else 'at '}{sections} ({', '.join(names)})")
    if "." in key:
        head, rest = key.split(".", 1)
        return (f"is not a known setting; a dotted path is only understood in a study's space "
                f"and fidelity overrides, so nest it here ({head}: {{{rest}: ...}})")
    return "is not a known setting (check its spelling and place in the file)"


def _field_paths(model: type[BaseModel], name: str, prefix: str = "",
                 seen: frozenset = frozenset()) -> list[tuple[str, Any]]:
    """(dotted path, FieldInfo) of every field called `name` in the sections under `model`."""
    if model in seen:
        return []
    seen = seen | {model}
    out: list[tuple[str, Any]] = []
    for field_name, info in model.model_fields.items():
        here = f"{prefix}{field_name}"
        if field_name == name:
            out.append((here, info))
        for sub in _models_in(info.annotation):
            out.extend(_field_paths(sub, name, here + ".", seen))
    return out


def _models_in(ann: Any) -> list[type[BaseModel]]:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(ann):
        out.extend(_models_in(arg))
    return out


def path_text(parts: list[str | int] | tuple) -> str:
    """A path as a config file's reader writes it: sections by dots, list items by index in
    brackets (traffic[0].size_bytes)."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


class _Path:
    """A pydantic error location walked through the model's annotations: the user's path (union
    labels and discriminator tags dropped, a dict-key error folded into its mapping) and what
    the walk learnt about the last field."""

    def __init__(self) -> None:
        self.parts: list[str | int] = []
        self.union_at: int | None = None     # index in loc of a non-discriminated member label
        self.key_error = False
        self.choices: tuple = ()             # the Literal values of the last field, if any
        self.tags: list[str] = []            # the discriminator values of the last union
        self.tuple_length: int | None = None # a fixed-length tuple holding the last index
        self.parent_text = ""

    @property
    def text(self) -> str:
        return path_text(self.parts)

    @classmethod
    def of(cls, model: type[BaseModel] | None, loc: tuple,
           resolved: frozenset[int] = frozenset()) -> "_Path":
        path = cls()
        ann: Any = model
        before: Any = None
        discriminator: str | None = None
        for i, seg in enumerate(loc):
            ann, discriminator = _unwrap(ann, discriminator)
            members = _union_members(ann)
            if isinstance(seg, str) and seg.startswith("function-") and not members:
                continue        # a validator's label outside a union (a member's is its label)
            if seg == "[key]":      # the error is in the key just walked, not in its value
                path.key_error = True
                path.parts.pop()
                args = typing.get_args(_unwrap(before, None)[0])
                ann = args[0] if len(args) == 2 else None
                continue
            if members and discriminator:
                path.tags = [t for m in members for t in _tags(m, discriminator)]
                ann = next((m for m in members if seg in _tags(m, discriminator)), None)
                discriminator = None
                continue
            if members or i in resolved or (ann is None and isinstance(seg, str)
                                            and _looks_like_label(seg)):
                if path.union_at is None and i not in resolved:
                    path.union_at = i
                ann = None
                continue
            path.parent_text = path.text
            path.parts.append(seg)
            before = ann
            ann, discriminator, path.tuple_length = _step(ann, seg)
        ann, discriminator = _unwrap(ann, discriminator)
        if typing.get_origin(ann) is typing.Literal:
            path.choices = typing.get_args(ann)
        if discriminator:
            path.tags = [t for m in _union_members(ann) for t in _tags(m, discriminator)]
        return path


def _unwrap(ann: Any, discriminator: str | None) -> tuple[Any, str | None]:
    """Strip Annotated (noting a discriminator's field name) and Optional's None."""
    while typing.get_origin(ann) is typing.Annotated:
        args = typing.get_args(ann)
        for meta in args[1:]:
            discriminator = discriminator or getattr(meta, "discriminator", None)
        ann = args[0]
    members = _union_members(ann, keep_none=True)
    if members:
        rest = [m for m in members if m is not type(None)]
        if len(rest) == 1:
            return _unwrap(rest[0], discriminator)
    return ann, discriminator


def _union_members(ann: Any, keep_none: bool = False) -> list[Any]:
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = list(typing.get_args(ann))
        return args if keep_none else [a for a in args if a is not type(None)]
    return []


def _tags(model: Any, discriminator: str) -> list[str]:
    """The values of a discriminated union member's tag field."""
    model, _ = _unwrap(model, None)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return []
    info = model.model_fields.get(discriminator)
    if info is None or typing.get_origin(info.annotation) is not typing.Literal:
        return []
    return [str(v) for v in typing.get_args(info.annotation)]


def _step(ann: Any, seg: str | int) -> tuple[Any, str | None, int | None]:
    """The annotation one segment further down, its union's discriminator field (if it is a
    discriminated union), and the length of the fixed-length tuple `seg` indexes (if it does)."""
    if ann is None:
        return None, None, None
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        info = ann.model_fields.get(str(seg))
        if info is None:
            return None, None, None
        disc = info.discriminator
        return info.annotation, disc if isinstance(disc, str) else None, None
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin in (list, set, frozenset) and args:
        return args[0], None, None
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0], None, None
        index = seg if isinstance(seg, int) else 0
        return (args[index] if index < len(args) else None), None, len(args)
    if origin is dict and len(args) == 2:
        return args[1], None, None
    return None, None, None


def _looks_like_label(seg: str) -> bool:
    """Whether a location segment is pydantic's name for a union member (used where the walk
    lost the annotations)."""
    return (seg in _KIND_OF_LABEL or seg[:1].isupper()
            or any(seg.startswith(p) for p in ("literal[", "list[", "tuple[", "dict[", "set[",
                                                "union[", "nullable[", "lax-or-strict[",
                                                "json-or-python[", "is-instance[")))
