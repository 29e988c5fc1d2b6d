"""The web page's static contract, without a browser: its form matches the API's fields, defaults and bounds,
and it needs nothing from outside the app (no CDN, no build step)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from server.schemas import AccompanimentParams, ContinuationParams, InfillParams
from server.settings import STATIC_DIR, Settings

PAGE = STATIC_DIR / "index.html"
ENTRY = "/static/js/main.js"  # the page's entry module; it imports the others
MODULES = sorted((STATIC_DIR / "js").rglob("*.js"))


def _page_js() -> str:
    """Every module of the page, as one text: what the page's scripts say, wherever a piece of it lives."""
    return "\n".join(path.read_text() for path in MODULES)


class _Collector(HTMLParser):
    """Start tags in order; a <select> gets the options it holds in the page (`options`: (value, text)) and
    its initial `value` (the selected option, else the first), as a browser would submit it."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self._select: dict | None = None
        self._option: list | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "select":
            self._select = attrs
            attrs["options"] = []
        elif tag == "option" and self._select is not None:
            self._option = [attrs.get("value"), ""]
            self._select["options"].append(self._option)
            if "selected" in attrs or "value" not in self._select:
                self._select["value"] = attrs.get("value")

    def handle_data(self, data):
        if self._option is not None:
            self._option[1] += data

    def handle_endtag(self, tag):
        if tag == "option":
            self._option = None
        elif tag == "select":
            self._select = None


@pytest.fixture(scope="module")
def tags() -> list[tuple[str, dict[str, str | None]]]:
    collector = _Collector()
    collector.feed(PAGE.read_text())
    return collector.tags


@pytest.fixture(scope="module")
def form_inputs(tags) -> dict[str, dict[str, str | None]]:
    return {
        a["name"]: a | ({"type": "select"} if t == "select" else {})
        for t, a in tags
        if t in ("input", "select") and a.get("name") and a["name"] != "file"
    }


def _bound(field: str, kind: str) -> float | None:
    for meta in ContinuationParams.model_fields[field].metadata:
        value = getattr(meta, kind, None)
        if value is not None:
            return value
    return None


def test_every_form_field_is_an_api_field_and_every_api_field_has_an_input(form_inputs):
    # Every mode's fields share one form; `mode` is the page's own switch between them.
    fields = set(ContinuationParams.model_fields) | set(AccompanimentParams.model_fields)
    fields |= set(InfillParams.model_fields)  # Fill: start and end
    assert set(form_inputs) - {"mode"} == fields
    assert form_inputs["mode"]["type"] == "radio"


def test_every_input_has_a_label(tags):
    labelled = {a.get("for") for t, a in tags if t == "label"}
    ids = [a["id"] for t, a in tags if t in ("input", "select") and a.get("type") != "hidden"]
    assert ids, "no inputs found"
    assert [i for i in ids if i not in labelled] == []


NUMBER_FIELDS = ["seconds", "temperature", "top_k", "top_p", "shift_temperature", "seed", "num_samples"]
NUMBER_FIELDS += ["primer_seconds"]
NUMBER_FIELDS += ["density", "low_note", "high_note", "max_polyphony", "motif_end"]


@pytest.mark.parametrize("name", NUMBER_FIELDS)
def test_number_input_bounds_match_the_api(form_inputs, name):
    """max = the tighter of the schema's bound and the default server limit; min respects gt/ge."""
    attrs = form_inputs[name]
    assert attrs["type"] == "number"
    default = {k: f.default for k, f in Settings.model_fields.items()}  # not the environment's overrides
    operator_cap = {
        "seconds": default["max_seconds"],
        "primer_seconds": default["max_primer_seconds"],
        "num_samples": min(default["max_num_samples"], default["max_batch_rows"]),
    }.get(name)
    schema_max = _bound(name, "le")
    expected_max = min(v for v in (schema_max, operator_cap) if v is not None)
    assert float(attrs["max"]) == pytest.approx(expected_max)
    low = float(attrs["min"])
    if (gt := _bound(name, "gt")) is not None:
        assert low > gt
    if (ge := _bound(name, "ge")) is not None:
        assert low >= ge
    # The page's minimum must itself be accepted by the API, or the spinner's lowest value gives a 422.
    ContinuationParams(**{name: low})


def test_defaults_match_the_api(form_inputs):
    defaults, accompaniment = ContinuationParams(), AccompanimentParams()
    for name, attrs in form_inputs.items():
        if name == "mode":  # the page's switch, not a field
            continue
        if name in ("start", "end", "first_bar", "last_bar"):  # Fill's span: blank until dragged or typed
            assert not attrs.get("value"), name
            continue
        expected = getattr(defaults if name in ContinuationParams.model_fields else accompaniment, name)
        if attrs["type"] == "checkbox":
            assert ("checked" in attrs) is expected, name
        elif attrs["type"] == "select":
            assert attrs["value"] == ("" if expected is None else expected), name
        elif expected is None:
            assert not attrs.get("value"), f"{name}: blank means None in the API"
        elif attrs["type"] == "number":
            assert float(attrs["value"]) == pytest.approx(expected), name
        else:
            assert attrs["value"] == expected, name


def test_an_untouched_steer_section_steers_nothing(form_inputs):
    """Every control as the page first sends it (blank fields left out, as the page does) is no control."""
    sent = {
        name: attrs["value"]
        for name, attrs in form_inputs.items()
        if name in CONTROL_FIELDS and (attrs.get("value") or "").strip()
    }
    assert ContinuationParams(**sent).controls() is None


CONTROL_FIELDS = {"program", "key", "key_strength", "chords", "chord_strength", "density", "low_note"}
CONTROL_FIELDS |= {"high_note", "max_polyphony", "instruments"}


def test_the_page_sends_every_control_field():
    text = _page_js()
    listed = re.search(r"const CONTROL_FIELDS = \[(.*?)\];", text, re.S)
    assert listed, "CONTROL_FIELDS not found in the page's modules"
    assert set(re.findall(r'"(\w+)"', listed.group(1))) == CONTROL_FIELDS
    assert set(ContinuationParams.model_fields) >= CONTROL_FIELDS


@pytest.mark.parametrize("name", ["key", "key_strength", "chord_strength"])
def test_every_menu_choice_is_accepted_by_the_library(form_inputs, name):
    values = [value for value, _ in form_inputs[name]["options"]]
    assert len(values) == len(set(values)) > 1
    steered = {"key_strength": {"key": "C:major"}, "chord_strength": {"chords": "C"}}.get(name, {})
    for value in values:
        ContinuationParams(**steered, **{name: value}).controls()  # ControlError if it is not taken


def test_the_key_menu_offers_off_auto_and_every_major_and_minor_key(form_inputs):
    values = [value for value, _ in form_inputs["key"]["options"]]
    assert values[:2] == ["", "auto"]
    from musicrel.generation.controls import parse_key

    assert len({parse_key(v) for v in values[2:]}) == 24


def test_the_instrument_menu_starts_at_the_motifs_and_is_filled_from_the_api(form_inputs):
    """The 128 names come from /v1/model (`programs`, controls.gm_program_names), not a copy here."""
    assert form_inputs["program"]["options"] == [["", "the motif's"]]
    assert "info.programs" in _page_js()


def test_tracks_pattern_agrees_with_the_api_validator(form_inputs):
    pattern = re.compile(f"^(?:{form_inputs['tracks']['pattern']})$")  # HTML patterns are anchored
    for ok in ["merge", "0", "0,2", "1, 3"]:
        assert pattern.match(ok), ok
        ContinuationParams(tracks=ok)
    for bad in ["piano", "0;2", "-1", "1,"]:
        assert not pattern.match(bad), bad
        with pytest.raises(ValueError):
            ContinuationParams(tracks=bad)


def test_page_loads_only_its_own_assets(tags):
    refs = [a.get("src") or a.get("href") for t, a in tags if t in ("script", "link", "img")]
    refs = [r for r in refs if r and not r.startswith("data:")]
    assert ENTRY in refs and "/static/style.css" in refs
    for ref in refs:
        assert ref.startswith("/static/"), f"{ref}: the page must not load anything from elsewhere"
        assert (STATIC_DIR / ref.removeprefix("/static/")).is_file(), ref


def test_the_entry_is_loaded_as_a_module(tags):
    scripts = [a for t, a in tags if t == "script"]
    assert [(a.get("src"), a.get("type")) for a in scripts] == [(ENTRY, "module")]


@pytest.mark.parametrize(
    "asset", ["index.html", "style.css", *(str(p.relative_to(STATIC_DIR)) for p in MODULES)]
)
def test_no_external_urls_or_imports(asset):
    text = (STATIC_DIR / asset).read_text()
    external = r"""(src|href)\s*=\s*["']https?://|url\(\s*["']?https?://|@import|\bimport\s*\("""
    assert not re.search(external, text)
    assert not re.search(r"""\bfetch\(\s*["'`]https?://""", text)


IMPORT = re.compile(r"""^\s*(?:import|export)\b[^;]*?\bfrom\s*["']([^"']+)["']""", re.M)


def test_every_module_import_is_a_page_module():
    """Static imports name a module of the page by a relative path (no bare names: there is no build step to
    resolve them), and every module is reached from the entry, so none is left behind unused."""
    assert MODULES, "no modules under static/js"
    reached, todo = set(), [STATIC_DIR / ENTRY.removeprefix("/static/")]
    while todo:
        module = todo.pop().resolve()
        if module in reached:
            continue
        reached.add(module)
        for spec in IMPORT.findall(module.read_text()):
            assert spec.startswith(("./", "../")), f"{module.name}: {spec}"
            target = (module.parent / spec).resolve()
            assert target.is_file() and STATIC_DIR in target.parents, f"{module.name}: {spec}"
            todo.append(target)
    assert reached == {p.resolve() for p in MODULES}


def test_no_module_is_a_long_file():
    """Rooms the size of one idea (issue 41): the page is split by concern, none over 600 lines."""
    assert {p.name: n for p in MODULES if (n := p.read_text().count("\n")) > 600} == {}


def test_static_dir_is_the_package_folder():
    assert Path(STATIC_DIR).resolve() == (Path(__file__).resolve().parents[2] / "server" / "static")


def test_every_track_colour_is_defined_for_both_themes():
    """tracks.js cycles through TRACK_COLOURS colours, each a --track-N of style.css in the light theme and
    again in the dark one, all different within a theme."""
    count = int(re.search(r"export const TRACK_COLOURS = (\d+);", _page_js()).group(1))
    css = (STATIC_DIR / "style.css").read_text()
    light, dark = css.split("@media (prefers-color-scheme: dark)", 1)
    for theme in (light, dark.split("}\n}", 1)[0]):
        colours = dict(re.findall(r"--track-(\d+):\s*(#[0-9a-fA-F]{6});", theme))
        assert sorted(map(int, colours)) == list(range(count))
        assert len({c.lower() for c in colours.values()}) == count
