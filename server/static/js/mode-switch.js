// The mode switch: the page shows the chosen mode's fields (app's data-mode), its words on the buttons and
// the legend, and the sampling defaults the server gave for it.

import { $, app, clearError, clearFieldErrors, setStatus } from "./dom.js";
import { drawInput, mode } from "./modes.js";
import { resetResult } from "./results.js";
import { state } from "./state.js";

// The sampling fields the modes share take each mode's own defaults from the server (the accompaniment
// model keeps the nucleus the continuation model measured better without), unless the user changed them.
const SHARED_SAMPLING = ["temperature", "top_k", "top_p"];
const modeDefaults = {};

// The server's defaults for a mode's sampling fields (GET /v1/model).
export function setModeDefaults(name, defaults) { modeDefaults[name] = defaults; }

function applyModeDefaults(from, to) {
  const defaultsOf = (name) => modeDefaults[mode(name).defaultsOf || name];
  const before = defaultsOf(from), after = defaultsOf(to);
  if (!before || !after) return;
  for (const id of SHARED_SAMPLING) {
    const untouched = $(id).value === "" ? before[id] == null : Number($(id).value) === before[id];
    if (untouched) $(id).value = after[id] == null ? "" : String(after[id]);
  }
}

function setMode(name) {
  if (app.dataset.state === "loading") return;
  applyModeDefaults(state.mode, name);
  state.mode = name;
  app.dataset.mode = name;
  const def = mode(name), t = def.text;
  $("continue").textContent = t.button;
  $("legend-motif").textContent = t.motif;
  $("legend-cont").textContent = t.cont;
  $("play-motif").textContent = t.playMotif;
  $("play-cont").textContent = t.playCont;
  $("program").options[0].textContent = t.program;
  $("key").querySelector('option[value="auto"]').textContent = t.key;
  $("reroll").hidden = true;
  if (def.entered) def.entered();
  clearError();
  clearFieldErrors();
  resetResult();
  drawInput();
  setStatus(state.motifFile ? t.ready : t.empty);
}

export function wireModeSwitch() {
  for (const radio of document.querySelectorAll('input[name="mode"]')) {
    radio.addEventListener("change", () => { if (radio.checked) setMode(radio.value); });
  }
}
