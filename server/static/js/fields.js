// The form's fields: what a mode sends (the sampling fields every mode shares, then its own), the browser's
// check of them before sending, and the hints and marks that follow what is typed.

import { $, clearFieldError, showFieldError } from "./dom.js";
import { modes } from "./modes.js";
import { pitchName } from "./roll.js";
import { state } from "./state.js";

// The generation controls' form fields (the "Steer" section), sent when filled in: blank is the API's "not set".
export const CONTROL_FIELDS = ["program", "key", "key_strength", "chords", "chord_strength", "density", "low_note",
  "high_note", "max_polyphony", "instruments"];

const SAMPLING_FIELDS = ["temperature", "top_k", "top_p", "seed", "num_samples"];

// A mode's request body: the file, the sampling fields and the mode's own (`fields`, by input id; `addFields`
// for what is not one input's value). A blank input is left out (the API's default); a checkbox says
// true or false.
export function collectForm(def) {
  const fd = new FormData();
  fd.append("file", state.motifFile, state.motifFile.name);
  for (const id of [...SAMPLING_FIELDS, ...def.fields]) {
    const el = $(id);
    if (el.type === "checkbox") fd.append(el.name, el.checked ? "true" : "false");
    else if (el.value.trim() !== "") fd.append(el.name, el.value.trim());
  }
  if (def.addFields) def.addFields(fd);
  return fd;
}

// The first input the browser finds invalid among those the mode shows (index.html hides the others' with
// .NAME-only and .no-NAME), focused and marked beside; its complaint in words, or null.
export function validateSettings(def) {
  const hidden = [...modes().filter((m) => m !== def).map((m) => `.${m.name}-only`), `.no-${def.name}`].join(", ");
  for (const el of $("form").querySelectorAll("input")) {
    if (el.closest(hidden)) continue; // not sent in this mode
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

export function wireFields() {
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
}
