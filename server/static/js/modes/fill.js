// Fill a span: POST /v1/infills (JSON: every sample), of every track or of those picked (pick.js). The file
// is drawn with the span's new notes outlined, and the span is heard in place (from a little before it to a
// little after); Re-roll asks again with a new seed.

import { $, app, clearFieldError, fmt, showFieldError } from "../dom.js";
import { CONTROL_FIELDS } from "../fields.js";
import { defineMode, drawInput } from "../modes.js";
import { byInstrumentsModel, play } from "../results.js";
import { state, synth } from "../state.js";
import { submit } from "../task.js";
import { fillTrackPicker, nothingPicked, picked, pickedTracks } from "./pick.js";
import { defaultFillSpan, fillBars, fillSpan, resetFillSpan } from "./span.js";

const FILL_CONTEXT_S = 2; // seconds heard before the span, and half as many after it
const SAME_S = 0.006; // a note back within this of an uploaded one (a MIDI tick or two) is that note, kept

// A note of the answer that the upload has too, at the same pitch and times: one the span left as it was
// (a track not picked, a drum the model does not write) rather than one written anew.
function keptFrom(notes) {
  const byPitch = new Map();
  for (const n of notes) {
    if (!byPitch.has(n.pitch)) byPitch.set(n.pitch, []);
    byPitch.get(n.pitch).push(n);
  }
  return (n) => (byPitch.get(n.pitch) || []).some((o) => o.drum === n.drum && Math.abs(o.start - n.start) < SAME_S &&
    Math.abs(o.end - n.end) < SAME_S);
}

// Fill's "in place": the notes sounding from FILL_CONTEXT_S before the span to half that after it.
function playSpan(notes) {
  const sp = state.kind === "fill" && state.response ? { start: state.response.start, end: state.response.end } : fillSpan();
  if (!sp) return;
  const from = Math.max(0, sp.start - FILL_CONTEXT_S), to = sp.end + FILL_CONTEXT_S / 2;
  const heard = notes.filter((n) => n.start < to && n.end > from).map((n) => ({ ...n, end: Math.min(n.end, to) }));
  synth.play(heard, from);
}

const fillMode = defineMode({
  name: "fill",
  text: { button: "Fill", motif: "kept", cont: "new notes", playMotif: "▶ Original", playCont: "▶ Span in place",
    program: "the motif's", key: "auto (the key around the span)",
    ready: "Ready: choose a span (drag on the roll) and press Fill.", empty: "Load a MIDI file to start.",
    busy: "Filling" },
  endpoint: "/v1/infills",
  defaultsOf: "continue", // the sampling fields' server defaults it follows
  // Steer's controls but the instrument (hidden in Fill: the span's new notes join the file's own)
  fields: CONTROL_FIELDS.filter((id) => id !== "program"),
  addFields(fd) {
    const tracks = pickedTracks();
    if (tracks) fd.append("tracks", tracks); // only a choice: every track is the default
    const bars = fillBars();
    if (bars) {
      fd.append("first_bar", String(bars[0]));
      fd.append("last_bar", String(bars[1]));
    } else {
      fd.append("start", $("fill_start").value.trim());
      fd.append("end", $("fill_end").value.trim());
    }
  },
  check() {
    if (nothingPicked()) {
      showFieldError("tracks", "check at least one track to rewrite");
      return "check at least one track to rewrite in the span";
    }
    if (fillSpan() || fillBars()) return null;
    showFieldError("start", "choose a span: drag across the piano roll, or type its start and end");
    return "choose a span to fill: drag across the piano roll, or type its start and end";
  },
  answered: () => play("cont"), // the span in place
  rerolls: true,
  loaded() {
    fillTrackPicker(() => {
      clearFieldError($("fill-tracks"));
      if (state.mode === "fill" && !state.samples.length) drawInput();
    });
    if (state.mode === "fill" && state.motif) resetFillSpan();
  },
  entered: defaultFillSpan,
  span: (answer) => (answer ? { start: answer.start, end: answer.end } : fillSpan()),
  input() {
    const notes = state.motif.notes;
    const sp = fillSpan();
    const total = notes.reduce((m, n) => Math.max(m, n.end), 0);
    const inside = sp ? notes.filter((n) => picked(n) && n.start >= sp.start && n.start < sp.end).length : 0;
    return { notes, playCont: !!(sp && notes.length), label: sp
      ? `Piano roll: ${notes.length} notes over ${fmt(total, 1)} s; the span ${fmt(sp.start, 2)}–${fmt(sp.end, 2)} s ` +
        `holds ${inside} notes to write anew`
      : `Piano roll: ${notes.length} notes over ${fmt(total, 1)} s; drag across it to choose a span` };
  },
  // A note that starts in the span and is not one of the upload's there is new; the rest is the file's.
  split(body) {
    const kept = keptFrom(state.motif ? state.motif.notes : []);
    const isNew = (n) => n.start >= body.start - 1e-6 && n.start < body.end - 1e-6 && !kept(n);
    return ({ notes }) => ({ boundary: null, motifNotes: notes.filter((n) => !isNew(n)), contNotes: notes.filter(isNew) });
  },
  untitled: "music",
  fileTag: (body) => `filled-${fmt(body.start, 2)}-${fmt(body.end, 2)}`,
  rollLabel(motifNotes, contNotes) {
    const total = [...motifNotes, ...contNotes].reduce((m, n) => Math.max(m, n.end), 0);
    const sp = fillSpan();
    return `Piano roll: ${motifNotes.length} notes kept and ${contNotes.length} new notes in the span ` +
      `${fmt(sp.start, 2)}–${fmt(sp.end, 2)} s, over ${fmt(total, 1)} s`;
  },
  download: "filled file",
  noteCount: (s) => `${s.motifNotes.length} kept + ${s.contNotes.length} new in the span`,
  stages: [["generation_ms", "generation"]],
  summary: (body) => ["Span", `${fmt(body.start, 2)}–${fmt(body.end, 2)} s: ${body.removed} notes replaced`],
  done: (body, samples) => `${samples.length} filling${samples.length > 1 ? "s" : ""}, ` +
    `${samples[0].contNotes.length} new notes in ${fmt(body.start, 2)}–${fmt(body.end, 2)} s.` +
    byInstrumentsModel(body),
  // Original: the file as uploaded; the span in place and "all": the answer's notes where there is one.
  play(which) {
    const s = state.kind === "fill" ? state.samples[state.current] : null;
    const original = state.motif ? state.motif.notes : [];
    const heard = s ? [...s.motifNotes, ...s.contNotes] : original;
    if (which === "motif") synth.play(original, 0);
    else if (which === "cont") playSpan(heard);
    else synth.play(heard, 0);
  },
});

export function wireFill() {
  // Re-roll: the same span and settings with a new seed (the seed field emptied: the server draws one).
  $("reroll").addEventListener("click", () => {
    if (app.dataset.state === "loading" || state.mode !== "fill") return;
    $("seed").value = "";
    submit(fillMode);
  });
}
