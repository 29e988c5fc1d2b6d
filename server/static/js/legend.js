// The track legend beside the roll: one entry for each instrument drawn (its colour, its track's name, its
// General MIDI program by name, or drums), in the order of their colours; it follows what the roll shows.

import { $ } from "./dom.js";
import { trackColour } from "./roll-notes.js";
import { state } from "./state.js";

// "MELODY · Flute", "drums", "track 2 · Acoustic Bass": what a musician calls the track.
export function trackLabel(inst) {
  const program = inst.drum ? "drums" : (state.programs && state.programs[inst.program]) || `program ${inst.program}`;
  const name = inst.name.trim() || (inst.drum ? "" : inst.track != null ? `track ${inst.track}` : "");
  return name && name.toLowerCase() !== program.toLowerCase() ? `${name} · ${program}` : program;
}

export function renderLegend(layers) {
  const list = $("track-legend");
  const entries = state.colours.present(layers.flatMap((l) => l.notes));
  list.replaceChildren(...entries.map((inst) => {
    const li = document.createElement("li");
    li.dataset.slot = String(inst.slot);
    if (inst.drum) li.dataset.drum = "true";
    const swatch = document.createElement("span");
    swatch.className = inst.drum ? "swatch swatch-drum" : "swatch";
    swatch.style.setProperty("--swatch", `var(${trackColour(inst.slot)})`);
    swatch.setAttribute("aria-hidden", "true");
    li.append(swatch, document.createTextNode(trackLabel(inst)));
    return li;
  }));
  list.hidden = !entries.length;
}
