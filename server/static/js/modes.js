// The page's modes (continue, accompany, fill) are each one definition (modes/*.js), registered here and read
// by the shared parts (task.js sends, results.js shows, mode-switch.js switches), which never import a mode.
// A definition holds:
//   name                     also names its own fields in index.html (.NAME-only; .no-NAME: hidden in it)
//   text                     words on the button, legend and play buttons, the status lines, the busy verb
//   fields, addFields(fd)    the inputs it sends beside the sampling ones; what is not one input's value
//   endpoint, request(form, signal, started)   a plain POST to it, or a request of its own (a stream)
//   startAudio(), answered(body)   audio opened within the click; what follows the answer (playing it)
//   check()                  a complaint of its own before the browser's checks of the fields
//   loaded(), entered()      a new file; the switch to this mode
//   input()                  the file before any answer: {notes, label, shade?, playCont?}
//   span(answer?)            the span it marks on the roll (with the file's bars)
//   split(body)              -> (a sample's parsed MIDI) => {motifNotes, contNotes, boundary}
//   untitled, fileTag(body)  the download's name
//   rollLabel(...), download, noteCount(sample)   a sample in words
//   stages, timingNotes(body), summary(body, samples), done(body, samples)   the answer's facts in words
//   keepsPlaying, rerolls, defaultsOf, play(which)   where it differs: live playback, Re-roll, whose
//                            sampling defaults it takes, its own play buttons

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
  roll.set([{ notes, role: "kept" }], null, ...shade);
  $("roll").setAttribute("aria-label", label);
  for (const id of ["play-all", "play-motif"]) $(id).disabled = !notes.length;
  $("play-cont").disabled = !playCont;
}
