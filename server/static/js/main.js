// musicrel web page, the entry module (index.html loads it; native ES modules, no build step, no libraries).
// Parses MIDI itself (SMF), draws a piano roll on a canvas, plays notes with a small WebAudio synth, and
// follows POST /v1/continuations/stream (the JSON form of POST /v1/continuations when streaming fails).

import { parseMidi } from "./midi.js";
import { PianoRoll, pitchName } from "./roll.js";
import { Synth } from "./synth.js";

const $ = (id) => document.getElementById(id);
const app = $("app");
const roll = new PianoRoll($("roll"));
const state = {
  motifFile: null, // File (uploaded or example)
  motif: null, // parsed motif
  samples: [], // [{notes, motifNotes, boundary, bytes, url, raw}]
  current: 0,
  response: null,
  abort: null,
  prepared: null, // the POST /v1/motifs of the current motif (a promise of its answer, null on failure)
  preparedInfo: null,
  stream: null, // the last Continue: transport ("stream" | "plain") and its timeline (performance.now() ms)
  mode: "continue", // or "accompany" or "fill" (the mode switch; app's data-mode shows each mode's fields)
  kind: "continue", // what state.samples hold: a continuation, an accompaniment or a fill
};

// Under 1 kB in bytes: a 6-byte file rounded up to "1 KB" hid that it is far too small to be MIDI.
const fmtBytes = (b) =>
  b >= 1e6 ? `${+(b / 1e6).toFixed(1)} MB` : b >= 1e3 ? `${+(b / 1e3).toFixed(1)} KB` : `${b} bytes`;
const fmt = (x, digits = 2) => (typeof x === "number" ? +x.toFixed(digits) : x);

function setState(s) { app.dataset.state = s; }

function setStatus(text) { $("status").textContent = text; }

function showError(message, code) {
  const box = $("error");
  box.replaceChildren();
  const strong = document.createElement("strong");
  strong.textContent = "Error: ";
  box.append(strong, document.createTextNode(message));
  if (code) {
    const c = document.createElement("code");
    c.textContent = ` (${code})`;
    box.append(c);
  }
  box.hidden = false;
}

function clearError() { $("error").hidden = true; $("error").replaceChildren(); }

function motifWindow(motif, primerSeconds) {
  // The server's answer to POST /v1/motifs when it is for these settings (it also knows the token cap);
  // until then the same rule as its prepare_primer: the primer_seconds before motif_end (or the last note).
  const info = state.preparedInfo;
  if (info && info.motifEnd === $("motif_end").value.trim() && info.primerSeconds === $("primer_seconds").value)
    return { start: info.primer.start_time, end: info.primer.end_time };
  const pitched = motif.notes.filter((n) => !n.drum);
  if (!pitched.length) return { start: 0, end: 0 };
  const last = Math.max(...pitched.map((n) => n.end));
  const asked = Number($("motif_end").value);
  const end = $("motif_end").value.trim() && asked > 0 ? Math.min(asked, last) : last;
  return { start: Math.max(Math.min(...pitched.map((n) => n.start)), end - primerSeconds), end };
}

// What the model reads, in words, once the server has said (POST /v1/motifs).
function describePrimerRead() {
  const info = state.preparedInfo;
  const p = info && info.primer;
  if (!p) { $("primer-read").textContent = ""; return; }
  const read = p.end_time - p.start_time;
  const cap = p.cropped ? ` — only ${fmt(read, 1)} of the ${fmt(p.requested_seconds, 1)} s asked: the model ` +
    `reads at most ${p.tokens} tokens of a motif this dense` : "";
  $("primer-read").textContent = `The model reads ${fmt(p.start_time, 1)}–${fmt(p.end_time, 1)} s of the file ` +
    `(${p.notes} notes) and continues from ${fmt(p.end_time, 1)} s on ${p.instrument}${cap}.`;
}

function rollLabel(motifNotes, contNotes, boundary) {
  const total = [...motifNotes, ...contNotes].reduce((m, n) => Math.max(m, n.end), 0);
  if (state.kind === "fill") {
    const sp = fillSpan();
    return `Piano roll: ${motifNotes.length} notes kept and ${contNotes.length} new notes in the span ` +
      `${fmt(sp.start, 2)}–${fmt(sp.end, 2)} s, over ${fmt(total, 1)} s`;
  }
  if (state.kind === "accompany") {
    return `Piano roll: melody of ${motifNotes.length} notes and an accompaniment of ${contNotes.length} notes ` +
      `over ${fmt(total, 1)} s`;
  }
  if (!contNotes.length) return `Piano roll: motif of ${motifNotes.length} notes over ${fmt(total, 1)} s`;
  return `Piano roll: motif of ${motifNotes.length} notes, then a continuation of ${contNotes.length} notes ` +
    `from ${fmt(boundary, 1)} s to ${fmt(total, 1)} s`;
}

function drawMotifOnly() {
  roll.span = state.mode === "fill" ? fillSpan() : null;
  roll.bars = state.mode === "fill" && state.motif ? state.motif.downbeats : null;
  if (!state.motif) { roll.set([], null); return; }
  if (state.mode === "accompany") { drawMelodyOnly(); return; }
  if (state.mode === "fill") { drawFillSpan(); return; }
  const win = motifWindow(state.motif, Number($("primer_seconds").value) || 0);
  const last = Math.max(0, ...state.motif.notes.map((n) => n.end));
  roll.set([{ notes: state.motif.notes, color: "--motif" }], null, win.start, win.end < last - 1e-6 ? win.end : null);
  $("roll").setAttribute("aria-label", rollLabel(state.motif.notes, [], 0));
  for (const id of ["play-all", "play-motif"]) $(id).disabled = !state.motif.notes.length;
  $("play-cont").disabled = true;
}

// --- Accompany mode: the melody track of the file, drawn alone until it has an accompaniment ---

// The chosen melody's notes: the instrument picked in the track menu, else every pitched note (a one-track
// file, or a file the page could not tell the instruments of).
function melodyNotes() {
  if (!state.motif) return [];
  const chosen = $("track").value;
  const pitched = state.motif.notes.filter((n) => !n.drum);
  return chosen === "" ? pitched : pitched.filter((n) => String(n.instrument) === chosen);
}

function drawMelodyOnly() {
  const notes = melodyNotes();
  roll.set([{ notes, color: "--motif" }], null);
  const end = notes.reduce((m, n) => Math.max(m, n.end), 0);
  $("roll").setAttribute("aria-label", `Piano roll: melody of ${notes.length} notes over ${fmt(end, 1)} s`);
  for (const id of ["play-all", "play-motif"]) $(id).disabled = !notes.length;
  $("play-cont").disabled = true;
}

// The track menu: the file's pitched instruments, numbered as the server counts them. One of them: the
// server picks it (blank). Several: the one named like a melody, else the first, for the user to change.
function fillTrackMenu() {
  const select = $("track");
  select.replaceChildren();
  const pitched = state.motif ? state.motif.instruments.filter((i) => !i.drum && i.notes) : [];
  const label = (i) => `${i.index}: ${i.name || `track ${i.track}`} (${i.notes} notes)`;
  if (pitched.length <= 1) {
    const opt = document.createElement("option");
    opt.value = "";
    opt.textContent = pitched.length ? `${label(pitched[0])}, the only one` : "the file's only track with notes";
    select.append(opt);
    return;
  }
  for (const i of pitched) {
    const opt = document.createElement("option");
    opt.value = String(i.index);
    opt.textContent = label(i);
    select.append(opt);
  }
  const named = pitched.find((i) => /melody|vocal|voice|lead|tune/i.test(i.name || ""));
  select.value = String((named || pitched[0]).index);
}

// --- Fill mode: a span of the file chosen on the roll (drag) or in two inputs, regenerated by POST /v1/infills ---

// The span in bars, when it was typed as bars ([first, last], 1-based): the request sends them as such and the
// server reads them against the file; the seconds inputs show where the page counts them.
function fillBars() {
  const first = Number($("fill_first_bar").value), last = Number($("fill_last_bar").value);
  const set = $("fill_first_bar").value.trim() !== "" && $("fill_last_bar").value.trim() !== "";
  return set && Number.isInteger(first) && Number.isInteger(last) ? [first, last] : null;
}

function clearFillBars() {
  $("fill_first_bar").value = "";
  $("fill_last_bar").value = "";
}

function fillSpan() {
  const start = Number($("fill_start").value), end = Number($("fill_end").value);
  const set = $("fill_start").value.trim() !== "" && $("fill_end").value.trim() !== "";
  return set && Number.isFinite(start) && Number.isFinite(end) ? { start, end } : null;
}

function drawFillSpan() {
  const notes = state.motif.notes;
  roll.set([{ notes, color: "--motif" }], null);
  const sp = fillSpan();
  const total = notes.reduce((m, n) => Math.max(m, n.end), 0);
  const inside = sp ? notes.filter((n) => !n.drum && n.start >= sp.start && n.start < sp.end).length : 0;
  $("roll").setAttribute("aria-label", sp
    ? `Piano roll: ${notes.length} notes over ${fmt(total, 1)} s; the span ${fmt(sp.start, 2)}–${fmt(sp.end, 2)} s ` +
      `holds ${inside} notes to write anew`
    : `Piano roll: ${notes.length} notes over ${fmt(total, 1)} s; drag across it to choose a span`);
  $("play-all").disabled = !notes.length;
  $("play-motif").disabled = !notes.length;
  $("play-cont").disabled = !(sp && notes.length);
}

// A first span for a file loaded in Fill: a few seconds in its middle, which has music before and after.
function defaultFillSpan() {
  if (!state.motif || fillSpan()) return;
  const pitched = state.motif.notes.filter((n) => !n.drum);
  if (!pitched.length) return;
  const first = Math.min(...pitched.map((n) => n.start)), last = Math.max(...pitched.map((n) => n.start));
  const length = Math.min(4, Math.max(0.5, (last - first) / 3));
  const start = first + (last - first - length) / 2;
  $("fill_start").value = String(fmt(start, 2));
  $("fill_end").value = String(fmt(start + length, 2));
}

// Dragging across the roll in Fill mode sets the span (both inputs follow).
let spanDrag = null;
$("roll").addEventListener("pointerdown", (e) => {
  if (state.mode !== "fill" || !state.motif || app.dataset.state === "loading") return;
  const t = roll.timeAt(e.clientX);
  if (t == null) return;
  spanDrag = { from: t, moved: false };
  $("roll").setPointerCapture(e.pointerId);
});
$("roll").addEventListener("pointermove", (e) => {
  if (!spanDrag) return;
  const t = roll.timeAt(e.clientX);
  if (t == null) return;
  spanDrag.moved = true;
  $("fill_start").value = String(fmt(Math.min(spanDrag.from, t), 2));
  $("fill_end").value = String(fmt(Math.max(spanDrag.from, t), 2));
  clearFillBars();
  for (const id of ["fill_start", "fill_end", "fill_first_bar", "fill_last_bar"]) clearFieldError($(id));
  roll.span = fillSpan();
  roll.draw();
});
$("roll").addEventListener("pointerup", () => {
  if (!spanDrag) return;
  const moved = spanDrag.moved;
  spanDrag = null;
  if (moved) redrawFillSpan();
});
function redrawFillSpan() {
  if (!state.samples.length) drawMotifOnly();
  else { roll.span = fillSpan(); roll.draw(); }
}
for (const id of ["fill_start", "fill_end"]) {
  $(id).addEventListener("input", () => {
    if (state.mode !== "fill") return;
    clearFillBars();
    redrawFillSpan();
  });
}
// Bars typed: the seconds follow, where the file's downbeats put them (the last bar ends where the next begins).
for (const id of ["fill_first_bar", "fill_last_bar"]) {
  $(id).addEventListener("input", () => {
    const bars = fillBars(), beats = state.motif ? state.motif.downbeats : [];
    if (state.mode !== "fill" || !bars) return;
    const [first, last] = bars;
    if (first >= 1 && first <= last && last < beats.length) {
      $("fill_start").value = String(fmt(beats[first - 1], 3));
      $("fill_end").value = String(fmt(beats[last], 3));
    }
    redrawFillSpan();
  });
}

const MODE_TEXT = {
  continue: { button: "Continue", motif: "motif", cont: "continuation", playMotif: "▶ Motif", playCont: "▶ Continuation",
    program: "the motif's", key: "auto (the motif's key)", ready: "Ready: press Continue.", empty: "Load a motif to start." },
  accompany: { button: "Accompany", motif: "melody", cont: "accompaniment", playMotif: "▶ Melody", playCont: "▶ Accompaniment",
    program: "piano (the default)", key: "auto (the melody's key)", ready: "Ready: press Accompany.", empty: "Load a melody to start." },
  fill: { button: "Fill", motif: "kept", cont: "new notes", playMotif: "▶ Original", playCont: "▶ Span in place",
    program: "the motif's", key: "auto (the key around the span)", ready: "Ready: choose a span (drag on the roll) and press Fill.", empty: "Load a MIDI file to start." },
};

// The sampling fields the modes share take each mode's own defaults from the server (the accompaniment
// model keeps the nucleus the continuation model measured better without), unless the user changed them.
const SHARED_SAMPLING = ["temperature", "top_k", "top_p"];
const modeDefaults = {};

function applyModeDefaults(from, to) {
  const before = modeDefaults[from === "accompany" ? "accompany" : "continue"];
  const after = modeDefaults[to === "accompany" ? "accompany" : "continue"];
  if (!before || !after) return;
  for (const id of SHARED_SAMPLING) {
    const untouched = $(id).value === "" ? before[id] == null : Number($(id).value) === before[id];
    if (untouched) $(id).value = after[id] == null ? "" : String(after[id]);
  }
}

function setMode(mode) {
  if (app.dataset.state === "loading") return;
  applyModeDefaults(state.mode, mode);
  state.mode = mode;
  app.dataset.mode = mode;
  const t = MODE_TEXT[mode];
  $("continue").textContent = t.button;
  $("legend-motif").textContent = t.motif;
  $("legend-cont").textContent = t.cont;
  $("play-motif").textContent = t.playMotif;
  $("play-cont").textContent = t.playCont;
  $("program").options[0].textContent = t.program;
  $("key").querySelector('option[value="auto"]').textContent = t.key;
  $("reroll").hidden = true;
  if (mode === "fill") defaultFillSpan();
  clearError();
  clearFieldErrors();
  resetResult();
  drawMotifOnly();
  setStatus(state.motifFile ? t.ready : t.empty);
  if (mode === "continue" && state.motifFile && !state.prepared) prepareMotif();
}

for (const radio of document.querySelectorAll('input[name="mode"]')) {
  radio.addEventListener("change", () => { if (radio.checked) setMode(radio.value); });
}
$("track").addEventListener("change", () => { if (!state.samples.length) drawMotifOnly(); });

async function loadMotif(file, sourceLabel) {
  clearError();
  resetResult();
  state.motifFile = file;
  state.motif = null;
  state.prepared = null;
  state.preparedInfo = null;
  try {
    state.motif = parseMidi(await file.arrayBuffer());
  } catch (err) {
    // The browser's parser is only for the preview; the server's verdict is the one that counts.
    state.motif = null;
    $("motif-info").textContent = `${sourceLabel}: ${file.name} (${fmtBytes(file.size)}) — ` +
      `cannot preview it here (${err.message}); the server will check it.`;
    roll.set([], null);
    fillTrackMenu();
    prepareMotif();
    $("continue").disabled = false;
    setStatus(MODE_TEXT[state.mode].ready);
    return;
  }
  const m = state.motif;
  const pitched = m.notes.filter((n) => !n.drum).length;
  if (state.mode === "fill") { $("fill_start").value = ""; $("fill_end").value = ""; clearFillBars(); defaultFillSpan(); }
  $("motif-info").textContent = `${sourceLabel}: ${file.name} — ${m.notes.length} notes` +
    `${pitched !== m.notes.length ? ` (${m.notes.length - pitched} drum)` : ""}, ` +
    `${fmt(m.duration, 1)} s, ${m.noteTracks} track${m.noteTracks === 1 ? "" : "s"} with notes, ${Math.round(m.bpm)} bpm`;
  fillTrackMenu();
  drawMotifOnly();
  prepareMotif();
  warmAudio();
  $("continue").disabled = false;
  setStatus(MODE_TEXT[state.mode].ready);
}

// The motif goes to the server as soon as it is chosen (POST /v1/motifs): it parses it and prefills its
// primer while the user reads the roll, so the first Continue starts decoding at once, as a re-roll does.
// Only a speed-up: a failure here is left for Continue to report.
function prepareMotif() {
  if (!state.motifFile || state.mode !== "continue") return; // only a continuation reads a primer
  const fd = new FormData();
  fd.append("file", state.motifFile, state.motifFile.name);
  fd.append("primer_seconds", $("primer_seconds").value);
  const motifEnd = $("motif_end").value.trim();
  if (motifEnd) fd.append("motif_end", motifEnd);
  fd.append("tracks", ($("tracks").value.trim() || "merge").replace(/\s+/g, ""));
  const started = performance.now();
  const file = state.motifFile;
  const primerSeconds = $("primer_seconds").value;
  state.preparedInfo = null;
  describePrimerRead();
  state.prepared = fetch("/v1/motifs", { method: "POST", body: fd })
    .then((r) => (r.ok ? r.json() : null))
    .catch(() => null)
    .then((body) => {
      if (state.motifFile === file) {
        state.preparedInfo = body && { ...body, ms: performance.now() - started, motifEnd, primerSeconds };
        describePrimerRead();
        if (!state.samples.length) drawMotifOnly(); // the window the server will read, marked on the roll
      }
      return body;
    });
}

// Opening the audio device holds the page 100-200 ms the first time: done while the user reads the roll, not
// between Continue and the first note. Made outside a gesture, the context starts suspended; Continue resumes
// it (browsers start audio only on a user's gesture).
function warmAudio() {
  try {
    synth.ensureContext(false);
  } catch {
    // no Web Audio: Continue reports it
  }
}

function resetResult() {
  synth.stop();
  for (const s of state.samples) URL.revokeObjectURL(s.url);
  state.samples = [];
  state.response = null;
  $("download").hidden = true;
  $("result-info").hidden = true;
  $("sample-tabs").hidden = true;
  $("sample-tabs").replaceChildren();
  $("stop").disabled = true;
  $("reroll").hidden = true;
  if (app.dataset.state === "done") setState("idle");
}

// --- input: file picker, drag and drop, examples ---

$("file").addEventListener("change", () => {
  const f = $("file").files[0];
  if (f) { $("example").value = ""; $("example-description").textContent = ""; loadMotif(f, "Uploaded"); }
});

const dz = $("dropzone");
for (const ev of ["dragenter", "dragover"]) {
  dz.addEventListener(ev, (e) => { e.preventDefault(); dz.classList.add("dragover"); });
}
for (const ev of ["dragleave", "drop"]) dz.addEventListener(ev, () => dz.classList.remove("dragover"));
dz.addEventListener("drop", (e) => {
  e.preventDefault();
  const f = e.dataTransfer.files[0];
  if (f) { $("example").value = ""; $("example-description").textContent = ""; loadMotif(f, "Dropped"); }
});
// A file dropped outside the zone would otherwise navigate away from the page.
window.addEventListener("dragover", (e) => e.preventDefault());
window.addEventListener("drop", (e) => e.preventDefault());

const examples = new Map();

async function loadExamples() {
  // The API's list first (it checks the files exist); the static index when the API is not there.
  const fetchJson = (url) => fetch(url).then((r) => (r.ok ? r.json() : null)).catch(() => null);
  let list = await fetchJson("/v1/examples");
  if (!Array.isArray(list) || !list.length) {
    const index = await fetchJson("/static/examples/index.json");
    list = (Array.isArray(index) ? index : []).map((e) => ({ ...e, url: `/static/examples/${e.file}` }));
  }
  const select = $("example");
  for (const e of list) {
    const file = e.file || (e.url || "").split("/").pop();
    if (!file || examples.has(file)) continue;
    examples.set(file, { name: e.name || file, url: e.url, description: e.description || "" });
    const opt = document.createElement("option");
    opt.value = file;
    opt.textContent = e.name || file;
    select.append(opt);
  }
}

$("example").addEventListener("change", async () => {
  const e = examples.get($("example").value);
  $("example-description").textContent = e ? e.description : "";
  if (!e) return;
  try {
    const r = await fetch(e.url);
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const blob = await r.blob();
    $("file").value = "";
    await loadMotif(new File([blob], $("example").value, { type: "audio/midi" }), "Example");
  } catch (err) {
    showError(`could not load the example ${e.name}: ${err.message}`);
  }
});

// --- settings ---

// The generation controls' form fields (the "Steer" section), sent when filled in: blank is the API's "not set".
const CONTROL_FIELDS = ["program", "key", "key_strength", "chords", "chord_strength", "density", "low_note",
  "high_note", "max_polyphony"];

// The API names the field an error is about (`field` of a 422); its message goes next to that input too, so a
// bad chord symbol is pointed at where it was typed, with the Steer section opened if it was folded.
function showFieldError(field, message) {
  const el = field && document.querySelector(`#form [name="${CSS.escape(field)}"]`);
  if (!el || el.type === "file") return false;
  const box = el.closest(".field") || el.parentElement;
  let note = $(`${field}-error`);
  if (!note) {
    note = document.createElement("p");
    note.id = `${field}-error`;
    note.className = "field-error";
    box.append(note);
  }
  note.textContent = message;
  note.hidden = false;
  el.setAttribute("aria-invalid", "true");
  el.setAttribute("aria-errormessage", note.id);
  const folded = el.closest("details");
  if (folded) folded.open = true;
  return true;
}

function clearFieldError(el) {
  const note = $(`${el.name}-error`);
  if (note) { note.hidden = true; note.textContent = ""; }
  el.removeAttribute("aria-invalid");
  el.removeAttribute("aria-errormessage");
}

function clearFieldErrors() {
  for (const el of $("form").querySelectorAll("[aria-invalid]")) clearFieldError(el);
}

// Editing a field the server complained about takes its complaint away.
for (const el of $("form").querySelectorAll("input, select")) {
  el.addEventListener("input", () => { if (el.hasAttribute("aria-invalid")) clearFieldError(el); });
}

// The pitch fields say which note a number is (60 = C4).
for (const id of ["low_note", "high_note"]) {
  const hint = $(`${id}-hint`), plain = hint.textContent;
  $(id).addEventListener("input", () => {
    const v = Number($(id).value);
    hint.textContent = $(id).value !== "" && Number.isInteger(v) && v >= 0 && v <= 127 ? `${pitchName(v)} (MIDI ${v})` : plain;
  });
}

function buildForm() {
  const fd = new FormData();
  fd.append("file", state.motifFile, state.motifFile.name);
  for (const id of ["seconds", "temperature", "top_p", "shift_temperature", "num_samples", "primer_seconds"]) {
    fd.append(id, $(id).value);
  }
  for (const id of ["top_k", "seed", "motif_end", ...CONTROL_FIELDS]) if ($(id).value.trim() !== "") fd.append(id, $(id).value.trim());
  const tracks = $("tracks").value.trim() || "merge";
  fd.append("tracks", tracks.replace(/\s+/g, ""));
  fd.append("include_primer", $("include_primer").checked ? "true" : "false");
  return fd;
}

function validateSettings() {
  const otherMode = {
    accompany: ".continue-only, .fill-only", continue: ".accompany-only, .fill-only", fill: ".continue-only, .accompany-only, .no-fill",
  }[state.mode];
  for (const el of $("form").querySelectorAll("input")) {
    if (el.closest(otherMode)) continue; // not sent in this mode
    if (!el.checkValidity()) {
      const label = document.querySelector(`label[for="${el.id}"]`);
      const name = label ? label.textContent.trim() : el.name;
      const folded = el.closest("details");
      if (folded) folded.open = true; // a folded input cannot take the focus
      el.focus();
      showFieldError(el.name, el.validationMessage);
      return `${name}: ${el.validationMessage}`;
    }
  }
  return null;
}

// --- request ---

function decodeBase64(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

async function readError(resp) {
  let code = `http_${resp.status}`;
  let message = resp.statusText || `the server answered HTTP ${resp.status}`;
  let field = null;
  try {
    const body = await resp.json();
    const err = body && body.error;
    if (err) { code = err.code || code; message = err.message || message; field = err.field || null; }
    else if (body && body.detail) {
      // FastAPI's own validation shape: [{loc, msg}] -> "seconds: Input should be ..."
      message = Array.isArray(body.detail)
        ? body.detail.map((d) => `${(d.loc || []).filter((l) => l !== "body").join(".")}: ${d.msg}`).join("; ")
        : String(body.detail);
    }
  } catch (_) { /* not JSON: keep the HTTP status text */ }
  const retry = resp.headers.get("Retry-After");
  if (retry) message += ` (retry in ${retry} s)`;
  return { code, message, field };
}

// Continue streams the continuation (POST /v1/continuations/stream): each note is played and drawn as it
// arrives, and the final event brings the MIDI files. If streaming itself fails (no such route, a proxy
// that cuts or buffers the stream, a browser without readable streams) the page asks the plain endpoint.
// The first note sounds this long after it arrives: room for the next notes' jitter (a chord's notes come a
// few decoding steps apart, ~5-10 ms each); a note later than that moves the timeline (synth.live.slips).
const LIVE_LEAD_S = 0.06;

class StreamFailed extends Error {}

$("form").addEventListener("submit", async (e) => {
  e.preventDefault();
  if (!state.motifFile || app.dataset.state === "loading") return;
  if (state.mode === "accompany") { accompany(); return; }
  if (state.mode === "fill") { fill(); return; }
  performance.clearMarks();
  performance.mark("musicrel:continue");
  clearError();
  clearFieldErrors();
  const invalid = validateSettings();
  if (invalid) { showError(invalid, "invalid_setting"); return; }
  resetResult();
  if (state.motif) drawMotifOnly();
  setState("loading");
  $("continue").disabled = true;
  $("cancel").hidden = false;
  const started = performance.now();
  const tick = setInterval(() => setStatus(`Generating… ${((performance.now() - started) / 1000).toFixed(1)} s`), 100);
  setStatus("Generating…");
  state.abort = new AbortController();
  state.stream = { clickAt: started, transport: "stream", notes: 0 };
  // A preparation still running would be repeated by this request (parse and prefill again, in parallel);
  // waiting for it is never longer than doing it again.
  const preparing = state.prepared;
  state.stream.preparing = !!preparing && !state.preparedInfo;
  // The request leaves first: starting the audio context can hold the page for 100-200 ms the first time.
  const stream = () => streamContinuation(state.abort.signal);
  const streaming = preparing ? preparing.then(stream) : stream();
  try {
    synth.startLive(LIVE_LEAD_S); // within the click: browsers start audio only on a user's gesture
  } catch (err) {
    showError(`cannot play audio: ${err.message}`, "audio");
  }
  try {
    let body;
    try {
      body = await streaming;
    } catch (err) {
      if (!(err instanceof StreamFailed)) throw err;
      state.stream.transport = "plain";
      state.stream.fallbackReason = err.message;
      synth.stop();
      body = await plainContinuation(state.abort.signal, state.stream.seed);
    }
    app.dataset.transport = state.stream.transport;
    showResult(body, (performance.now() - started) / 1000);
    const cont = state.samples.length ? state.samples[0].contNotes : [];
    if (synth.live) synth.liveEnd(cont.reduce((m, n) => Math.max(m, n.end), 0) - state.samples[0].boundary);
  } catch (err) {
    showFailure(err);
  } finally {
    endRequest(tick);
  }
});

// --- Accompany: POST /v1/accompaniments (JSON: every sample), then the melody and the accompaniment drawn in
// the two colours and played together ---

function accompanyForm() {
  const fd = new FormData();
  fd.append("file", state.motifFile, state.motifFile.name);
  for (const id of ["temperature", "top_p", "num_samples"]) fd.append(id, $(id).value);
  for (const id of ["track", "top_k", "seed", ...CONTROL_FIELDS]) if ($(id).value.trim() !== "") fd.append(id, $(id).value.trim());
  return fd;
}

async function accompany() {
  clearError();
  clearFieldErrors();
  const invalid = validateSettings();
  if (invalid) { showError(invalid, "invalid_setting"); return; }
  resetResult();
  drawMotifOnly();
  setState("loading");
  $("continue").disabled = true;
  $("cancel").hidden = false;
  try {
    synth.ensureContext(true); // within the click: the result plays when it comes
  } catch (err) {
    showError(`cannot play audio: ${err.message}`, "audio");
  }
  const started = performance.now();
  const tick = setInterval(() => setStatus(`Accompanying… ${((performance.now() - started) / 1000).toFixed(1)} s`), 100);
  setStatus("Accompanying…");
  state.abort = new AbortController();
  try {
    const resp = await fetch("/v1/accompaniments", {
      method: "POST", body: accompanyForm(), headers: { Accept: "application/json" }, signal: state.abort.signal,
    });
    if (!resp.ok) {
      const { code, message, field } = await readError(resp);
      throw Object.assign(new Error(message), { code, field });
    }
    const body = await resp.json();
    showAccompaniment(body, (performance.now() - started) / 1000);
    play("all"); // the melody and its accompaniment together
  } catch (err) {
    showFailure(err);
  } finally {
    endRequest(tick);
  }
}

function showAccompaniment(body, elapsed) {
  state.kind = "accompany";
  state.response = body;
  const samples = body.samples || [];
  if (!samples.length) throw Object.assign(new Error("the server returned no samples"), { code: "empty_result" });
  const base = (state.motifFile.name || "melody").replace(/\.(mid|midi)$/i, "");
  state.samples = samples.map((s, i) => {
    const bytes = decodeBase64(s.midi_base64);
    let parsed = { notes: [], tracks: [] };
    try { parsed = parseMidi(bytes.buffer); } catch (_) { /* drawn empty; the download is still offered */ }
    // The answer holds the melody's track and one named "accompaniment" (musicrel.accompaniment).
    const isAcc = (n) => parsed.tracks[n.track] === "accompaniment";
    const url = URL.createObjectURL(new Blob([bytes], { type: "audio/midi" }));
    const suffix = samples.length > 1 ? `-${(s.index ?? i) + 1}` : "";
    return { bytes, url, raw: s, boundary: null,
      motifNotes: parsed.notes.filter((n) => !isAcc(n)), contNotes: parsed.notes.filter(isAcc),
      filename: `${base}-accompanied${body.seed != null ? `-seed${body.seed}` : ""}${suffix}.mid` };
  });
  showSampleTabs();
  selectSample(0);
  const t = body.timings || {};
  const ms = (k, label) => (num(t[k]) != null ? `${label} ${fmt(t[k] / 1000, 3)} s` : null);
  $("info-timings").textContent = [
    ms("parse_ms", "parse"), ms("queue_ms", "queue"), ms("generation_ms", "generation"), ms("total_ms", "server total"),
    `round trip ${fmt(elapsed, 2)} s`, num(body.real_time_factor) != null ? `${fmt(body.real_time_factor, 1)}× real time` : null,
  ].filter(Boolean).join(" · ");
  $("info-seed").textContent = body.seed ?? "—";
  $("info-tokens-label").textContent = "Accompaniment";
  $("info-tokens").textContent = `melody track ${body.melody_track}, ${fmt(body.seconds, 1)} s accompanied on ${body.instrument}` +
    ((body.warnings || []).length ? ` — ${body.warnings.join("; ")}` : "");
  $("result-info").hidden = false;
  setState("done");
  setStatus(`Done in ${fmt(elapsed, 1)} s: ${state.samples.length} accompaniment${state.samples.length > 1 ? "s" : ""}, ` +
    `${state.samples[0].contNotes.length} notes under ${state.samples[0].motifNotes.length} of melody.`);
}

// --- Fill: POST /v1/infills (JSON: every sample), then the file drawn with the span's new notes in the second
// colour, and the span heard in place (from a little before it to a little after) ---

const FILL_CONTEXT_S = 2; // seconds heard before the span, and half as many after it

function fillForm() {
  const fd = new FormData();
  fd.append("file", state.motifFile, state.motifFile.name);
  const bars = fillBars();
  if (bars) {
    fd.append("first_bar", String(bars[0]));
    fd.append("last_bar", String(bars[1]));
  } else {
    fd.append("start", $("fill_start").value.trim());
    fd.append("end", $("fill_end").value.trim());
  }
  for (const id of ["temperature", "top_p", "num_samples"]) fd.append(id, $(id).value);
  // Steer's controls but the instrument (hidden in Fill: the span's new notes join the file's own)
  const controls = CONTROL_FIELDS.filter((id) => id !== "program");
  for (const id of ["top_k", "seed", ...controls]) if ($(id).value.trim() !== "") fd.append(id, $(id).value.trim());
  return fd;
}

async function fill() {
  clearError();
  clearFieldErrors();
  if (!fillSpan() && !fillBars()) {
    showFieldError("start", "choose a span: drag across the piano roll, or type its start and end");
    showError("choose a span to fill: drag across the piano roll, or type its start and end", "invalid_setting");
    return;
  }
  const invalid = validateSettings();
  if (invalid) { showError(invalid, "invalid_setting"); return; }
  resetResult();
  drawMotifOnly();
  setState("loading");
  $("continue").disabled = true;
  $("cancel").hidden = false;
  try {
    synth.ensureContext(true); // within the click: the result plays when it comes
  } catch (err) {
    showError(`cannot play audio: ${err.message}`, "audio");
  }
  const started = performance.now();
  const tick = setInterval(() => setStatus(`Filling… ${((performance.now() - started) / 1000).toFixed(1)} s`), 100);
  setStatus("Filling…");
  state.abort = new AbortController();
  try {
    const resp = await fetch("/v1/infills", {
      method: "POST", body: fillForm(), headers: { Accept: "application/json" }, signal: state.abort.signal,
    });
    if (!resp.ok) {
      const { code, message, field } = await readError(resp);
      throw Object.assign(new Error(message), { code, field });
    }
    const body = await resp.json();
    showFill(body, (performance.now() - started) / 1000);
    play("cont"); // the span in place
  } catch (err) {
    showFailure(err);
  } finally {
    endRequest(tick);
  }
}

function showFill(body, elapsed) {
  state.kind = "fill";
  state.response = body;
  const samples = body.samples || [];
  if (!samples.length) throw Object.assign(new Error("the server returned no samples"), { code: "empty_result" });
  const base = (state.motifFile.name || "music").replace(/\.(mid|midi)$/i, "");
  const inSpan = (n) => !n.drum && n.start >= body.start - 1e-6 && n.start < body.end - 1e-6;
  state.samples = samples.map((s, i) => {
    const bytes = decodeBase64(s.midi_base64);
    let notes = [];
    try { notes = parseMidi(bytes.buffer).notes; } catch (_) { /* drawn empty; the download is still offered */ }
    const url = URL.createObjectURL(new Blob([bytes], { type: "audio/midi" }));
    const suffix = samples.length > 1 ? `-${(s.index ?? i) + 1}` : "";
    // Every note that starts in the span is new (the old ones there were removed); the rest is the file's.
    return { bytes, url, raw: s, boundary: null, motifNotes: notes.filter((n) => !inSpan(n)),
      contNotes: notes.filter(inSpan),
      filename: `${base}-filled-${fmt(body.start, 2)}-${fmt(body.end, 2)}${body.seed != null ? `-seed${body.seed}` : ""}${suffix}.mid` };
  });
  showSampleTabs();
  selectSample(0);
  const t = body.timings || {};
  const ms = (k, label) => (num(t[k]) != null ? `${label} ${fmt(t[k] / 1000, 3)} s` : null);
  $("info-timings").textContent = [
    ms("parse_ms", "parse"), ms("queue_ms", "queue"), ms("generation_ms", "generation"), ms("total_ms", "server total"),
    `round trip ${fmt(elapsed, 2)} s`,
  ].filter(Boolean).join(" · ");
  $("info-seed").textContent = body.seed ?? "—";
  $("info-tokens-label").textContent = "Span";
  $("info-tokens").textContent = `${fmt(body.start, 2)}–${fmt(body.end, 2)} s: ${body.removed} notes replaced` +
    ((body.warnings || []).length ? ` — ${body.warnings.join("; ")}` : "");
  $("result-info").hidden = false;
  $("reroll").hidden = false;
  setState("done");
  setStatus(`Done in ${fmt(elapsed, 1)} s: ${state.samples.length} filling${state.samples.length > 1 ? "s" : ""}, ` +
    `${state.samples[0].contNotes.length} new notes in ${fmt(body.start, 2)}–${fmt(body.end, 2)} s.`);
}

// Re-roll: the same span and settings with a new seed (the seed field emptied: the server draws one).
$("reroll").addEventListener("click", () => {
  if (app.dataset.state === "loading" || state.mode !== "fill") return;
  $("seed").value = "";
  fill();
});

async function plainContinuation(signal, seed) {
  const form = buildForm();
  if (seed != null) form.set("seed", String(seed)); // what was already heard of the stream comes again
  const resp = await fetch("/v1/continuations", { method: "POST", body: form, headers: { Accept: "application/json" }, signal });
  if (!resp.ok) {
    const { code, message, field } = await readError(resp);
    throw Object.assign(new Error(message), { code, field });
  }
  return resp.json();
}

// POST the form to the stream endpoint and follow its NDJSON events; resolves with the final result (the
// plain endpoint's JSON), rejects with the API's error, or with StreamFailed when streaming did not work.
async function streamContinuation(signal) {
  let resp;
  try {
    resp = await fetch("/v1/continuations/stream", { method: "POST", body: buildForm(), signal });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new StreamFailed(`the stream request failed (${err.message})`);
  }
  state.stream.headersAt = performance.now();
  if ([404, 405, 501].includes(resp.status)) throw new StreamFailed(`no stream endpoint (HTTP ${resp.status})`);
  if (!resp.ok) {
    const { code, message, field } = await readError(resp);
    throw Object.assign(new Error(message), { code, field }); // the server's verdict: the plain endpoint says the same
  }
  if (!resp.body || !resp.body.getReader) throw new StreamFailed("this browser cannot read a response as it arrives");
  const live = new LiveRoll();
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (err) {
      if (err.name === "AbortError") throw err;
      throw new StreamFailed(`the stream broke off (${err.message})`);
    }
    if (chunk.done) break;
    buffer += decoder.decode(chunk.value, { stream: true });
    let nl;
    while ((nl = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + 1);
      if (!line.trim()) continue;
      let event;
      try { event = JSON.parse(line); } catch (_) { throw new StreamFailed("the stream sent a line that is not JSON"); }
      if (event.type === "result") {
        state.stream.resultAt = performance.now();
        reader.cancel().catch(() => {});
        return event;
      }
      if (event.type === "error") {
        const err = event.error || {};
        throw Object.assign(new Error(err.message || `HTTP ${event.status}`),
          { code: err.code || `http_${event.status}`, field: err.field || null });
      }
      live.handle(event);
    }
  }
  throw new StreamFailed("the stream ended before its result");
}

// The roll and the synth follow a stream: the first sample's notes sound and are drawn as they arrive, open
// notes reaching as far as the stream has got.
class LiveRoll {
  constructor() {
    this.boundary = 0;
    this.notes = new Map(); // id -> drawn note (first sample)
    this.cont = [];
    state.stream.liveNotes = this.cont; // what has been heard (tests compare it with the result)
    this.motif = [];
    this.clock = 0; // seconds of the continuation the stream has reached
    this.pending = false;
  }

  handle(e) {
    if (e.type === "start") return this.start(e);
    if (e.sample !== 0) return; // the other samples are shown from the result
    if (e.type === "note_on") {
      const n = { pitch: e.pitch, velocity: e.velocity, start: this.boundary + e.time, end: null, program: this.program };
      this.notes.set(e.id, n);
      this.cont.push(n);
      this.clock = Math.max(this.clock, e.time);
      synth.liveOn(e.id, { pitch: e.pitch, velocity: e.velocity, start: e.time, program: this.program });
      if (state.stream.notes++ === 0) {
        state.stream.firstNoteAt = performance.now();
        performance.mark("musicrel:first-note");
        if (synth.live && synth.live.first) Object.assign(state.stream, synth.live.first);
        setStatus("Playing as it is generated…");
      }
    } else if (e.type === "note_off") {
      const n = this.notes.get(e.id);
      if (n) n.end = this.boundary + e.time;
      this.clock = Math.max(this.clock, e.time);
      synth.liveOff(e.id, e.time);
    } else if (e.type === "note_drop") {
      const n = this.notes.get(e.id);
      this.notes.delete(e.id);
      if (n) this.cont.splice(this.cont.indexOf(n), 1);
      synth.liveDrop(e.id);
    }
    $("roll").dataset.liveNotes = String(this.cont.length);
    this.redraw();
  }

  start(e) {
    state.stream.startAt = performance.now();
    state.stream.seed = e.seed;
    const p = e.primer || {};
    this.program = num(e.settings && e.settings.program) ?? num(p.program) ?? 0; // the program field's, if set
    const winStart = num(p.start_time) ?? 0;
    this.boundary = (num(p.end_time) ?? 0) - winStart;
    if (synth.live) synth.live.offset = this.boundary;
    this.motif = state.motif ? state.motif.notes
      .filter((n) => !n.drum && n.end > winStart)
      .map((n) => ({ ...n, start: Math.max(0, n.start - winStart), end: n.end - winStart })) : [];
    this.redraw();
  }

  redraw() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      if (app.dataset.state !== "loading") return; // the result has taken over the roll
      const until = this.boundary + this.clock;
      const drawn = this.cont.map((n) => (n.end == null ? { ...n, end: Math.max(n.start + 0.05, until) } : n));
      const playhead = roll.playhead;
      roll.set([{ notes: this.motif, color: "--motif" }, { notes: drawn, color: "--cont" }], this.boundary);
      roll.playhead = playhead;
    });
  }
}

$("cancel").addEventListener("click", () => state.abort && state.abort.abort());

// --- result ---

function showResult(body, elapsed) {
  state.kind = "continue";
  state.response = body;
  const samples = body.samples || [];
  if (!samples.length) throw Object.assign(new Error("the server returned no samples"), { code: "empty_result" });
  const includePrimer = !!(body.settings && body.settings.include_primer);
  // The server primes on [primer.start_time, primer.end_time] of the upload (its last primer_seconds); the
  // roll shows that window from 0 and the continuation from where the motif ends.
  const fallback = state.motif ? motifWindow(state.motif, Number($("primer_seconds").value)) : { start: 0, end: 0 };
  const p = body.primer || {};
  const winStart = num(p.start_time) ?? fallback.start;
  const motifEnd = num(p.end_time) ?? fallback.end;
  const boundary = motifEnd - winStart;
  const inWindow = (notes, shift) => notes
    .filter((n) => !n.drum && n.end > winStart + shift)
    .map((n) => ({ ...n, start: Math.max(0, n.start - shift - winStart), end: n.end - shift - winStart }));
  const uploadedMotif = state.motif ? inWindow(state.motif.notes, 0) : [];
  const base = (state.motifFile.name || "motif").replace(/\.(mid|midi)$/i, "");

  state.samples = samples.map((s, i) => {
    const bytes = decodeBase64(s.midi_base64);
    let notes = [];
    try { notes = parseMidi(bytes.buffer).notes; } catch (_) { /* drawn empty; the download is still offered */ }
    let motifNotes, contNotes;
    if (includePrimer) {
      // The file holds the whole motif at its own times, then the continuation from the motif's end.
      motifNotes = inWindow(notes.filter((n) => n.start < motifEnd - 1e-6), 0);
      contNotes = inWindow(notes.filter((n) => n.start >= motifEnd - 1e-6), 0);
    } else {
      motifNotes = uploadedMotif;
      contNotes = notes.map((n) => ({ ...n, start: n.start + boundary, end: n.end + boundary }));
    }
    const url = URL.createObjectURL(new Blob([bytes], { type: "audio/midi" }));
    const suffix = samples.length > 1 ? `-${(s.index ?? i) + 1}` : "";
    return { bytes, url, motifNotes, contNotes, boundary, raw: s,
      filename: `${base}-continued${body.seed != null ? `-seed${body.seed}` : ""}${suffix}.mid` };
  });

  showSampleTabs();
  selectSample(0, true); // a stream's live playback goes on to its end
  if (synth.live) $("stop").disabled = false;

  const t = body.timings || {};
  const ms = (k, label) => (num(t[k]) != null ? `${label} ${fmt(t[k] / 1000, 3)} s` : null);
  $("info-timings").textContent = [
    ms("parse_ms", "parse"), ms("queue_ms", "queue"), ms("prefill_ms", "prefill"), ms("decode_ms", "decode"),
    ms("total_ms", "server total"), `round trip ${fmt(elapsed, 2)} s`,
    state.stream && state.stream.soundsAt ? `first note heard ${fmt((state.stream.soundsAt - state.stream.clickAt) / 1000, 3)} s` : null,
  ].filter(Boolean).join(" · ");
  $("info-seed").textContent = body.seed ?? "—";
  const tokens = body.new_tokens ?? samples.reduce((a, s) => a + (s.new_tokens || 0), 0);
  $("info-tokens-label").textContent = "Tokens";
  $("info-tokens").textContent = `${tokens} new` + (num(p.tokens) != null ? `, primer ${p.tokens}` : "") +
    (body.batch && body.batch.requests > 1 ? ` (batched with ${body.batch.requests - 1} other request${body.batch.requests > 2 ? "s" : ""})` : "");
  $("result-info").hidden = false;
  setState("done");
  const n = state.samples[0].contNotes.length;
  setStatus(`Done in ${fmt(elapsed, 1)} s: ${state.samples.length} sample${state.samples.length > 1 ? "s" : ""}, ` +
    `${n} new notes in the first${body.stopped ? " (stopped early at the deadline)" : ""}.`);
}

const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);

// How a request that failed or was cancelled ends (a continuation's or an accompaniment's).
function showFailure(err) {
  synth.stop();
  setState("error");
  if (err.name === "AbortError") { setStatus("Cancelled."); }
  else {
    showError(err.code ? err.message : `could not reach the server (${err.message})`, err.code || "network");
    if (err.field) showFieldError(err.field, err.message);
    setStatus("Failed — adjust and try again.");
  }
}

function endRequest(tick) {
  clearInterval(tick);
  state.abort = null;
  $("cancel").hidden = true;
  $("continue").disabled = !state.motifFile;
}

// One tab per sample when there are several (continuations and accompaniments alike).
function showSampleTabs() {
  const tabs = $("sample-tabs");
  tabs.replaceChildren();
  if (state.samples.length > 1) {
    state.samples.forEach((_, i) => {
      const b = document.createElement("button");
      b.type = "button";
      b.setAttribute("role", "tab");
      b.setAttribute("aria-controls", "roll");
      b.id = `sample-tab-${i}`;
      b.textContent = `Sample ${i + 1}`;
      b.addEventListener("click", () => selectSample(i));
      tabs.append(b);
    });
    tabs.hidden = false;
  }
}

function selectSample(i, keepPlaying = false) {
  if (!keepPlaying) synth.stop();
  state.current = i;
  const s = state.samples[i];
  for (const [j, tab] of [...$("sample-tabs").children].entries()) tab.setAttribute("aria-selected", String(i === j));
  roll.set([{ notes: s.motifNotes, color: "--motif" }, { notes: s.contNotes, color: "--cont" }], s.boundary);
  $("roll").setAttribute("aria-label", rollLabel(s.motifNotes, s.contNotes, s.boundary));
  $("roll").dataset.notes = String(s.contNotes.length);
  const a = $("download");
  a.href = s.url;
  a.download = s.filename;
  const accompanied = state.kind === "accompany", filled = state.kind === "fill";
  roll.span = filled ? { start: state.response.start, end: state.response.end } : null;
  roll.bars = filled && state.motif ? state.motif.downbeats : null;
  roll.draw();
  a.textContent = `Download ${state.samples.length > 1 ? `sample ${i + 1}` : accompanied ? "melody + accompaniment" : filled ? "filled file" : "continuation"} (.mid)`;
  a.hidden = false;
  $("info-notes").textContent = accompanied
    ? `${s.motifNotes.length} melody + ${s.contNotes.length} accompaniment`
    : filled ? `${s.motifNotes.length} kept + ${s.contNotes.length} new in the span`
    : `${s.motifNotes.length} motif (the primer: its last ${fmt(s.boundary, 1)} s) + ${s.contNotes.length} continuation`;
  $("play-all").disabled = !(s.motifNotes.length + s.contNotes.length);
  $("play-motif").disabled = !s.motifNotes.length;
  $("play-cont").disabled = !s.contNotes.length;
}

// --- playback ---

const synth = new Synth(
  (t) => { roll.playhead = t; roll.draw(); },
  () => { roll.playhead = null; roll.draw(); $("stop").disabled = true; },
);

function currentLayers() {
  const s = state.samples[state.current];
  if (s) return { motif: s.motifNotes, cont: s.contNotes, boundary: s.boundary };
  return { motif: state.motif ? state.motif.notes : [], cont: [], boundary: 0 };
}

// Fill's "in place": the notes sounding from FILL_CONTEXT_S before the span to half that after it.
function playSpan(notes) {
  const sp = state.kind === "fill" && state.response ? { start: state.response.start, end: state.response.end } : fillSpan();
  if (!sp) return;
  const from = Math.max(0, sp.start - FILL_CONTEXT_S), to = sp.end + FILL_CONTEXT_S / 2;
  const heard = notes.filter((n) => n.start < to && n.end > from).map((n) => ({ ...n, end: Math.min(n.end, to) }));
  synth.play(heard, from);
  $("stop").disabled = false;
}

function play(which) {
  if (state.mode === "fill") {
    try {
      const s = state.kind === "fill" ? state.samples[state.current] : null;
      const original = state.motif ? state.motif.notes : [];
      if (which === "motif") synth.play(original, 0); // the file as uploaded
      else if (which === "cont") playSpan(s ? [...s.motifNotes, ...s.contNotes] : original);
      else synth.play(s ? [...s.motifNotes, ...s.contNotes] : original, 0);
      $("stop").disabled = false;
    } catch (err) {
      showError(`cannot play audio: ${err.message}`, "audio");
    }
    return;
  }
  const { motif, cont, boundary } = currentLayers();
  const notes = which === "motif" ? motif : which === "cont" ? cont : [...motif, ...cont];
  try {
    synth.play(notes, which === "cont" ? boundary || 0 : 0); // an accompaniment has no boundary: from 0
    $("stop").disabled = false;
  } catch (err) {
    showError(`cannot play audio: ${err.message}`, "audio");
  }
}

$("play-all").addEventListener("click", () => play("all"));
$("play-motif").addEventListener("click", () => play("motif"));
$("play-cont").addEventListener("click", () => play("cont"));
$("stop").addEventListener("click", () => { synth.stop(); roll.playhead = null; roll.draw(); $("stop").disabled = true; });
for (const id of ["primer_seconds", "motif_end"]) $(id).addEventListener("input", () => { if (!state.samples.length) drawMotifOnly(); });
// Another primer window or track choice is another primer: prepare that one.
for (const id of ["primer_seconds", "motif_end", "tracks"]) $(id).addEventListener("change", () => { if ($(id).checkValidity()) prepareMotif(); });
$("volume").addEventListener("input", () => synth.setVolume(Number($("volume").value)));

// --- server status ---

async function pollReady() {
  const banner = $("ready-banner");
  try {
    const r = await fetch("/readyz", { cache: "no-store" });
    if (r.ok) { banner.hidden = true; return; }
    banner.textContent = "The model is still loading (or the server is shutting down); requests may be refused.";
  } catch (_) {
    banner.textContent = "The server is not reachable right now.";
  }
  banner.hidden = false;
  setTimeout(pollReady, 3000);
}

async function loadModelInfo() {
  try {
    const r = await fetch("/v1/model");
    if (!r.ok) {
      $("mode-hint").textContent = "the server did not say whether it can accompany";
      $("fill-mode-hint").textContent = "the server did not say whether it can fill spans";
      return;
    }
    const info = await r.json();
    const m = info.model || {};
    const bits = [];
    if (m.n_layers) bits.push(`${m.n_layers} layers`);
    if (m.d_model) bits.push(`d_model ${m.d_model}`);
    if (m.attention) bits.push(`${m.attention} attention`);
    if (info.parameters) bits.push(`${(info.parameters / 1e6).toFixed(info.parameters < 1e6 ? 3 : 1)} M parameters`);
    if (info.vocab_size) bits.push(`vocabulary ${info.vocab_size}`);
    if (info.sha256) bits.push(`checkpoint ${String(info.sha256).slice(0, 12)}`);
    if (bits.length) $("model-info").textContent = `Model: ${bits.join(" · ")}`;
    // The operator may have set tighter limits than the page's defaults: follow the server.
    const limits = info.limits || {};
    const cap = (id, value) => {
      if (num(value) == null) return;
      const el = $(id);
      el.max = String(value);
      if (Number(el.value) > value) el.value = String(value);
    };
    cap("seconds", limits.max_seconds);
    cap("primer_seconds", limits.max_primer_seconds);
    cap("num_samples", num(limits.max_num_samples) != null && num(limits.max_batch_rows) != null
      ? Math.min(limits.max_num_samples, limits.max_batch_rows) : limits.max_num_samples);
    cap("top_k", info.vocab_size);
    // The instrument menu: the General MIDI names as the library knows them (musicrel.controls).
    if (Array.isArray(info.programs) && $("program").options.length === 1) {
      info.programs.forEach((name, program) => {
        const opt = document.createElement("option");
        opt.value = String(program);
        opt.textContent = `${program} ${name}`;
        $("program").append(opt);
      });
    }
    // Fill is offered when the server has an infill model (POST /v1/infills); otherwise it stays disabled.
    const inf = info.infill;
    $("mode-fill").disabled = !inf;
    $("fill-mode-hint").textContent = inf
      ? `spans up to ${fmt(inf.max_span_seconds, 0)} s`
      : "this server has no infill model";
    // Accompany is offered when the server has an accompaniment model (POST /v1/accompaniments).
    const acc = info.accompaniment;
    if (limits.defaults) modeDefaults.continue = limits.defaults;
    if (acc && acc.defaults) modeDefaults.accompany = acc.defaults;
    $("mode-accompany").disabled = !acc;
    $("mode-hint").textContent = acc
      ? `melodies up to ${fmt(acc.max_melody_seconds, 0)} s`
      : "this server has no accompaniment model";
    if (num(limits.max_upload_bytes) != null) {
      $("upload-hint").textContent = `.mid / .midi, up to ${fmtBytes(limits.max_upload_bytes)}`;
    }
  } catch (_) { /* the footer line and limits are optional */ }
}

drawMotifOnly();
loadExamples();
pollReady();
loadModelInfo();

// Exposed for tests and the console; the page itself does not need it.
window.musicrel = { parseMidi, state, synth, roll };
