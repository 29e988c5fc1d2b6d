// Fill's track picker: one checkbox for each instrument with notes (pretty_midi's numbering, the `track` of an
// accompaniment and the `tracks` of a continuation), every one checked for a new file. The request names the
// checked ones in `tracks` only when some are not: every track is the API's default, and a server that does
// not know the field yet is never sent it for the default.

import { $ } from "../dom.js";
import { trackLabel } from "../legend.js";
import { trackColour } from "../roll-notes.js";
import { state } from "../state.js";

const boxes = () => [...$("fill-tracks-list").querySelectorAll('input[type="checkbox"]')];

// A new file: its instruments with notes, all checked.
export function fillTrackPicker(onChange) {
  const insts = state.motif ? state.motif.instruments.filter((i) => i.notes) : [];
  const slots = new Map(state.motif ? state.motif.notes.map((n) => [n.instrument, n.slot]) : []);
  $("fill-tracks-list").replaceChildren(...insts.map((inst) => {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.id = `fill-track-${inst.index}`;
    box.value = String(inst.index);
    box.checked = true;
    box.addEventListener("change", onChange);
    const swatch = document.createElement("span");
    swatch.className = inst.drum ? "swatch swatch-drum" : "swatch";
    swatch.style.setProperty("--swatch", `var(${trackColour(slots.get(inst.index))})`);
    swatch.setAttribute("aria-hidden", "true");
    label.htmlFor = box.id;
    label.append(box, swatch, document.createTextNode(`${inst.index}: ${trackLabel(inst)} (${inst.notes} notes)`));
    return label;
  }));
  $("fill-tracks").hidden = !insts.length;
}

// The checked instruments' indices as the API takes them ("1,3"); null when every one is checked.
export function pickedTracks() {
  const all = boxes(), on = all.filter((b) => b.checked);
  return on.length === all.length ? null : on.map((b) => b.value).join(",");
}

export const nothingPicked = () => boxes().length > 0 && !boxes().some((b) => b.checked);

// Whether a note of the upload is one the span rewrites (its instrument checked; all when there is no picker).
export function picked(note) {
  const box = $(`fill-track-${note.instrument}`);
  return !box || box.checked;
}
