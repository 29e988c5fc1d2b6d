// Continue a motif: POST /v1/continuations/stream, followed live (live.js), or POST /v1/continuations when
// streaming fails. The motif is prepared (POST /v1/motifs) as soon as it is chosen; the roll shows the
// primer window the model reads, then the continuation from where the motif ends.

import { fetchJson, postJson, StreamFailed } from "../api.js";
import { $, app, fmt, num } from "../dom.js";
import { CONTROL_FIELDS } from "../fields.js";
import { defineMode, drawInput } from "../modes.js";
import { byInstrumentsModel } from "../results.js";
import { state, synth } from "../state.js";
import { LIVE_LEAD_S, streamContinuation } from "./live.js";

const ENDPOINT = "/v1/continuations";

const tracksValue = () => ($("tracks").value.trim() || "merge").replace(/\s+/g, "");

function rollLabel(motifNotes, contNotes, boundary) {
  const total = [...motifNotes, ...contNotes].reduce((m, n) => Math.max(m, n.end), 0);
  if (!contNotes.length) return `Piano roll: motif of ${motifNotes.length} notes over ${fmt(total, 1)} s`;
  return `Piano roll: motif of ${motifNotes.length} notes, then a continuation of ${contNotes.length} notes ` +
    `from ${fmt(boundary, 1)} s to ${fmt(total, 1)} s`;
}

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
  fd.append("tracks", tracksValue());
  const started = performance.now();
  const file = state.motifFile;
  const primerSeconds = $("primer_seconds").value;
  state.preparedInfo = null;
  describePrimerRead();
  state.prepared = fetchJson("/v1/motifs", { method: "POST", body: fd }).then((body) => {
    if (state.motifFile === file) {
      state.preparedInfo = body && { ...body, ms: performance.now() - started, motifEnd, primerSeconds };
      describePrimerRead();
      if (!state.samples.length) drawInput(); // the window the server will read, marked on the roll
    }
    return body;
  });
}

// Streamed, and asked again of the plain endpoint when streaming itself fails.
async function request(form, signal, started) {
  state.stream = { clickAt: started, transport: "stream", notes: 0 };
  // A preparation still running would be repeated by this request (parse and prefill again, in parallel);
  // waiting for it is never longer than doing it again.
  const preparing = state.prepared;
  state.stream.preparing = !!preparing && !state.preparedInfo;
  const stream = () => streamContinuation(`${ENDPOINT}/stream`, form, signal);
  let body;
  try {
    body = await (preparing ? preparing.then(stream) : stream());
  } catch (err) {
    if (!(err instanceof StreamFailed)) throw err;
    state.stream.transport = "plain";
    state.stream.fallbackReason = err.message;
    synth.stop();
    // what was already heard of the stream comes again
    if (state.stream.seed != null) form.set("seed", String(state.stream.seed));
    body = await postJson(ENDPOINT, form, signal);
  }
  app.dataset.transport = state.stream.transport;
  return body;
}

// The server primes on [primer.start_time, primer.end_time] of the upload (its last primer_seconds); the
// roll shows that window from 0 and the continuation from where the motif ends.
function split(body) {
  const includePrimer = !!(body.settings && body.settings.include_primer);
  const fallback = state.motif ? motifWindow(state.motif, Number($("primer_seconds").value)) : { start: 0, end: 0 };
  const p = body.primer || {};
  const winStart = num(p.start_time) ?? fallback.start;
  const motifEnd = num(p.end_time) ?? fallback.end;
  const boundary = motifEnd - winStart;
  const drums = Array.isArray(body.tracks); // a model with instruments hears the drums; a piano model none
  const inWindow = (notes, shift) => notes
    .filter((n) => (drums || !n.drum) && n.end > winStart + shift)
    .map((n) => ({ ...n, start: Math.max(0, n.start - shift - winStart), end: n.end - shift - winStart }));
  const uploadedMotif = state.motif ? inWindow(state.motif.notes, 0) : [];
  return ({ notes }) => {
    if (includePrimer) {
      // The file holds the whole motif at its own times, then the continuation from the motif's end.
      return { boundary, motifNotes: inWindow(notes.filter((n) => n.start < motifEnd - 1e-6), 0),
        contNotes: inWindow(notes.filter((n) => n.start >= motifEnd - 1e-6), 0) };
    }
    return { boundary, motifNotes: uploadedMotif,
      contNotes: notes.map((n) => ({ ...n, start: n.start + boundary, end: n.end + boundary })) };
  };
}

defineMode({
  name: "continue",
  text: { button: "Continue", motif: "motif", cont: "continuation", playMotif: "▶ Motif", playCont: "▶ Continuation",
    program: "the motif's", key: "auto (the motif's key)", ready: "Ready: press Continue.",
    empty: "Load a motif to start.", busy: "Generating" },
  endpoint: ENDPOINT,
  fields: ["seconds", "shift_temperature", "primer_seconds", "motif_end", "include_primer", ...CONTROL_FIELDS],
  addFields: (fd) => fd.append("tracks", tracksValue()),
  request,
  startAudio: () => synth.startLive(LIVE_LEAD_S),
  keepsPlaying: true, // a stream's live playback goes on to its end
  answered() {
    const s = state.samples[0];
    if (synth.live) synth.liveEnd(s.contNotes.reduce((m, n) => Math.max(m, n.end), 0) - s.boundary);
  },
  loaded: prepareMotif,
  entered() { if (state.motifFile && !state.prepared) prepareMotif(); },
  input() {
    const notes = state.motif.notes;
    const win = motifWindow(state.motif, Number($("primer_seconds").value) || 0);
    const last = Math.max(0, ...notes.map((n) => n.end));
    return { notes, label: rollLabel(notes, [], 0), shade: [win.start, win.end < last - 1e-6 ? win.end : null] };
  },
  split,
  untitled: "motif",
  fileTag: () => "continued",
  rollLabel,
  download: "continuation",
  noteCount: (s) => `${s.motifNotes.length} motif (the primer: its last ${fmt(s.boundary, 1)} s) + ` +
    `${s.contNotes.length} continuation`,
  stages: [["prefill_ms", "prefill"], ["decode_ms", "decode"]],
  timingNotes: () => [state.stream && state.stream.soundsAt
    ? `first note heard ${fmt((state.stream.soundsAt - state.stream.clickAt) / 1000, 3)} s` : null],
  summary(body, samples) {
    const tokens = body.new_tokens ?? samples.reduce((a, s) => a + (s.new_tokens || 0), 0);
    const p = body.primer || {};
    return ["Tokens", `${tokens} new` + (num(p.tokens) != null ? `, primer ${p.tokens}` : "") +
      (body.batch && body.batch.requests > 1
        ? ` (batched with ${body.batch.requests - 1} other request${body.batch.requests > 2 ? "s" : ""})` : "")];
  },
  done: (body, samples) => `${samples.length} sample${samples.length > 1 ? "s" : ""}, ` +
    `${samples[0].contNotes.length} new notes in the first${body.stopped ? " (stopped early at the deadline)" : ""}.` +
    byInstrumentsModel(body),
});

export function wireContinue() {
  for (const id of ["primer_seconds", "motif_end"]) $(id).addEventListener("input", () => { if (!state.samples.length) drawInput(); });
  // Another primer window or track choice is another primer: prepare that one.
  for (const id of ["primer_seconds", "motif_end", "tracks"]) $(id).addEventListener("change", () => { if ($(id).checkValidity()) prepareMotif(); });
}
