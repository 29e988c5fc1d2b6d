"""The OpenAPI document as this server accepts requests: schemathesis (tests/server/test_api_fuzz.py) found
schema-valid forms refused with 422.

- The operator's limits (MUSICREL_MAX_SECONDS, ...; checked in deps.py) are the form's bounds, not only the
  fixed sanity bounds of the model: `seconds=320` was valid by the schema and refused by a server whose limit
  is 60.
- A form field cannot carry JSON null: an optional field is left out (or blank) to get its default, so the
  form's copy of the parameters says `integer` where the model says `integer | null` (`seed=null` was valid
  by the schema and refused as "unable to parse string as an integer"). The response keeps the model's own
  schema, where null is a real value.
- `tracks` has a pattern: the validator's rule ("merge", "all" or up to 64 indices below 1024, any case,
  blanks stripped as `str.strip` does) as a regular expression; a schema without it let any 400 characters
  through.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI

from musicrel.generation.controls import (
    CHORD_QUALITIES,
    DRUM_WORDS,
    INSTRUMENT_CHOICES,
    MAX_BIAS,
    MAX_CHORDS,
    SCALES,
    STRENGTHS,
    gm_program_names,
)
from server.settings import Settings

Forms = Iterable[tuple[str, str, str]]
# What str.strip() removes (str.isspace), spelled out: ECMA's \s differs (it has U+FEFF, lacks U+001C-1F).
_BLANK = "[ \t\n\r\x0b\x0c\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*"
_INDEX = f"{_BLANK}0*(?:[0-9]{{1,3}}|10[01][0-9]|102[0-3]){_BLANK}"
TRACKS_PATTERN = f"^{_BLANK}(?:[Mm][Ee][Rr][Gg][Ee]|[Aa][Ll][Ll]|{_INDEX}(?:,{_INDEX}){{0,63}})?{_BLANK}$"


def _any_case(word: str) -> str:
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else re_escape(c) for c in word)


def re_escape(text: str) -> str:
    return "".join("\\" + c if c in r"\^$.|?*+()[]{}/-" else c for c in text)


# The controls' text fields, as generation.controls parses them (its tables are the one source), in the subset
# of regular expressions both Python and ECMA read alike (ASCII blanks only; the parser takes more).
_SP = "[ \t]*"
_NOTE = "[A-Ga-g][#b]?"
_QUALITY = "(?:" + "|".join(re_escape(q) for q in sorted(CHORD_QUALITIES, key=len, reverse=True)) + ")"
_DURATION = "(?:[1-5]?[0-9](?:\\.[0-9]{0,3})?|60(?:\\.0{0,3})?)b?"  # > 0 checked below, <= 60 s
_CHORD = f"[A-G][#b]?{_QUALITY}(?:/{_NOTE})?(?::(?!0*(?:\\.0*)?b?(?:[ ,|]|$)){_DURATION})?"
CHORDS_PATTERN = f"^(?: *|[ ,|]*{_CHORD}(?:[ ,|]+{_CHORD}){{0,{MAX_CHORDS - 1}}}[ ,|]*)$"  # blank: unset
_SCALE = "(?:" + "|".join(_any_case(name) for name in sorted(SCALES, key=len, reverse=True)) + ")"
KEY_PATTERN = f"^{_SP}(?:{_any_case('auto')}|{_NOTE}{_SP}(?::{_SP}{_SCALE})?){_SP}$"
_WORDS = "|".join(_any_case(word) for word in STRENGTHS)
STRENGTH_PATTERN = f"^{_SP}(?:{_WORDS}|1?[0-9](?:\\.[0-9]*)?|{int(MAX_BIAS)}(?:\\.0*)?){_SP}$"
_NAMES = "|".join(_any_case(name) for name in sorted(gm_program_names(), key=len, reverse=True))
PROGRAM_NAME_PATTERN = f"^{_BLANK}(?:{_NAMES}){_BLANK}$"
# The instruments control (controls.parse_instruments): a word, or a list of programs (0-127, names) and drums
_DRUMS = "|".join(_any_case(word) for word in DRUM_WORDS)
_INSTRUMENT = f"{_SP}(?:0*(?:[0-9]{{1,2}}|1[01][0-9]|12[0-7])|{_NAMES}|{_DRUMS}){_SP}"
_CHOICES = "|".join(_any_case(word) for word in INSTRUMENT_CHOICES)
INSTRUMENTS_PATTERN = f"^{_SP}(?:{_CHOICES}|{_INSTRUMENT}(?:,{_INSTRUMENT}){{0,128}})?{_SP}$"  # blank: unset


def form_limits(settings: Settings, vocab_size: int | None) -> dict[str, float]:
    """The largest value of each bounded field this server accepts (deps.get_params checks the same)."""
    limits: dict[str, float] = {
        "seconds": settings.max_seconds,
        "primer_seconds": settings.max_primer_seconds,
        "num_samples": min(settings.max_num_samples, settings.max_batch_rows),
    }
    if vocab_size is not None:
        limits["top_k"] = vocab_size
    return limits


def _not_null(schema: dict[str, Any]) -> dict[str, Any]:
    """`anyOf: [X, {type: null}]` as X, keeping the title, description and a non-null default."""
    options = schema.get("anyOf")
    if not options:
        return schema
    kept = [option for option in options if option.get("type") != "null"]
    if len(kept) != 1:
        return schema
    out = {**{k: v for k, v in schema.items() if k not in ("anyOf", "default")}, **kept[0]}
    if schema.get("default") is not None:
        out["default"] = schema["default"]
    return out


def _form_fields(schema: dict[str, Any], limits: dict[str, float]) -> dict[str, Any]:
    """The form's copy of a parameter model's fields: not nullable, with patterns, bounded by `limits`."""
    params = {name: _not_null(field) for name, field in schema["properties"].items()}
    for name, pattern in (
        ("tracks", TRACKS_PATTERN),
        ("chords", CHORDS_PATTERN),
        ("key", KEY_PATTERN),
        ("key_strength", STRENGTH_PATTERN),
        ("chord_strength", STRENGTH_PATTERN),
        ("instruments", INSTRUMENTS_PATTERN),
    ):
        if name in params:
            params[name]["pattern"] = pattern
    if "program" in params:  # a number or a name (schemas.ContinuationParams._program_name)
        number = {k: v for k, v in params["program"].items() if k not in ("title", "description", "default")}
        params["program"] = {
            **{k: v for k, v in params["program"].items() if k in ("title", "description")},
            "anyOf": [number, {"type": "string", "pattern": PROGRAM_NAME_PATTERN}],
        }
    for name, limit in limits.items():
        field = params.get(name)
        for bound in ("maximum", "exclusiveMaximum"):
            if field is not None and bound in field and limit < field[bound]:
                field.pop(bound)
                field["maximum"] = limit
    return params


def tailor(document: dict[str, Any], limits: dict[str, float], forms: Forms) -> dict[str, Any]:
    """`document` with each form route's own copy of its parameters (`forms`: (path, method, the model its
    fields come from), server.routes.FORMS), bounded by `limits`."""
    document = copy.deepcopy(document)
    components = document["components"]["schemas"]
    for path, method, model in forms:
        params = _form_fields(components[model], limits)
        content = document["paths"][path][method]["requestBody"]["content"]["multipart/form-data"]
        body = components[content["schema"]["$ref"].rsplit("/", 1)[1]]
        body.pop("allOf", None)
        body["properties"] = {**params, **body["properties"]}
        required = [*components[model].get("required", []), *body.get("required", [])]
        if required:
            body["required"] = list(dict.fromkeys(required))
        if "oneOf" in components[model]:  # /v1/infills' span: in seconds or in bars
            body["oneOf"] = components[model]["oneOf"]
        body["additionalProperties"] = False  # deps.refuse_unknown_fields
    return document


def install(app: FastAPI, settings: Settings, vocab_size: Any, forms: Forms) -> None:
    """Serve the tailored document. `vocab_size()` is the loaded codec's (top_k's bound), None before the
    model is loaded: the document is cached only once it is known."""
    cached: dict[str, Any] = {}
    generate = app.openapi  # FastAPI's own, which caches its result in app.openapi_schema

    def openapi() -> dict[str, Any]:
        if cached:
            return cached
        document = generate()
        size = vocab_size()
        tailored = tailor(document, form_limits(settings, size), forms)
        if size is not None:
            cached.update(tailored)
        return tailored

    app.openapi = openapi  # type: ignore[method-assign]
