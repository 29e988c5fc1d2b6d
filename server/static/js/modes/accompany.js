// Accompany a melody: POST /v1/accompaniments (JSON: every sample). The melody track of the file is drawn
// alone until it has an accompaniment, then both in the two colours, played together.

import { $, fmt, num } from "../dom.js";
import { CONTROL_FIELDS } from "../fields.js";
import { defineMode, drawInput } from "../modes.js";
import { play } from "../results.js";
import { state } from "../state.js";

// The chosen melody's notes: the instrument picked in the track menu, else every pitched note (a one-track
// file, or a file the page could not tell the instruments of).
function melodyNotes() {
  if (!state.motif) return [];
  const chosen = $("track").value;
  const pitched = state.motif.notes.filter((n) => !n.drum);
  return chosen === "" ? pitched : pitched.filter((n) => String(n.instrument) === chosen);
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

defineMode({
  name: "accompany",
  text: { button: "Accompany", motif: "melody", cont: "accompaniment", playMotif: "▶ Melody",
    playCont: "▶ Accompaniment", program: "piano (the default)", key: "auto (the melody's key)",
    ready: "Ready: press Accompany.", empty: "Load a melody to start.", busy: "Accompanying" },
  endpoint: "/v1/accompaniments",
  fields: ["track", ...CONTROL_FIELDS],
  answered: () => play("all"), // the melody and its accompaniment together
  loaded: fillTrackMenu,
  input() {
    const notes = melodyNotes();
    const end = notes.reduce((m, n) => Math.max(m, n.end), 0);
    return { notes, label: `Piano roll: melody of ${notes.length} notes over ${fmt(end, 1)} s` };
  },
  // The answer holds the melody's track (its name, program and drums: its key, tracks.js) and the
  // accompaniment's: one named "accompaniment" (musicrel.accompaniment), or one for each instrument it wrote.
  split: () => {
    const melody = melodyNotes()[0];
    return ({ notes, tracks }) => {
      const isAcc = notes.some((n) => melody && n.key === melody.key) ? (n) => n.key !== melody.key
        : (n) => tracks[n.track] === "accompaniment";
      return { boundary: null, motifNotes: notes.filter((n) => !isAcc(n)), contNotes: notes.filter(isAcc) };
    };
  },
  untitled: "melody",
  fileTag: () => "accompanied",
  rollLabel(motifNotes, contNotes) {
    const total = [...motifNotes, ...contNotes].reduce((m, n) => Math.max(m, n.end), 0);
    return `Piano roll: melody of ${motifNotes.length} notes and an accompaniment of ${contNotes.length} notes ` +
      `over ${fmt(total, 1)} s`;
  },
  download: "melody + accompaniment",
  noteCount: (s) => `${s.motifNotes.length} melody + ${s.contNotes.length} accompaniment`,
  stages: [["generation_ms", "generation"]],
  timingNotes: (body) => [num(body.real_time_factor) != null ? `${fmt(body.real_time_factor, 1)}× real time` : null],
  summary: (body) => ["Accompaniment",
    `melody track ${body.melody_track}, ${fmt(body.seconds, 1)} s accompanied on ${body.instrument}`],
  done: (body, samples) => `${samples.length} accompaniment${samples.length > 1 ? "s" : ""}, ` +
    `${samples[0].contNotes.length} notes under ${samples[0].motifNotes.length} of melody.`,
});

export function wireAccompany() {
  $("track").addEventListener("change", () => { if (!state.samples.length) drawInput(); });
}
