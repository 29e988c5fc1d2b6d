// The page's modes (continue, accompany, fill) are each one definition (modes/*.js) read by the shared parts:
// its texts, the fields it sends, its request, and how the file and its answer are drawn, labelled and played.
// The definitions register here, so the shared parts (task.js, results.js) never import a mode.
//
// A definition: name (also the .NAME-only class of its own fields in index.html); text (button, legend, play
// buttons, status lines, busy verb); fields (the inputs it sends beside the sampling ones) and addFields(fd);
// endpoint, or request(form, signal, started) for more than a plain POST; input() (the file before any
// answer: {notes, label, shade?, playCont?}); split(body) (an answer's sample -> motif and new notes);
// span(answer?) for a mode that marks a span; optional hooks loaded(), entered(), check(), answered(), play().

import { $ } from "./dom.js";
import { roll, state } from "./state.js";

const defs = new Map();

export function defineMode(def) {
  defs.set(def.name, def);
  return def;
}

export const mode = (name = state.mode) => defs.get(name);
export const modes = () => [...defs.values()];

// The span a mode marks on the roll (Fill: the one typed or dragged, or the answer's) and the bars it is
// counted in.
export function markSpan(def, answer) {
  roll.span = def.span ? def.span(answer) : null;
  roll.bars = def.span && state.motif ? state.motif.downbeats : null;
}

// The loaded file before any answer, as the current mode shows it.
export function drawInput() {
  const def = mode();
  markSpan(def);
  if (!state.motif) { roll.set([], null); return; }
  const { notes, label, shade = [], playCont = false } = def.input();
  roll.set([{ notes, color: "--motif" }], null, ...shade);
  $("roll").setAttribute("aria-label", label);
  for (const id of ["play-all", "play-motif"]) $(id).disabled = !notes.length;
  $("play-cont").disabled = !playCont;
}
