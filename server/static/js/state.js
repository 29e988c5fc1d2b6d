// What the page holds: the loaded file, the answer's samples, the request in flight, and the one piano roll
// and synth that every part draws and plays with.

import { $ } from "./dom.js";
import { PianoRoll } from "./roll.js";
import { Synth } from "./synth.js";
import { TrackColours } from "./tracks.js";

export const state = {
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
  colours: new TrackColours(), // each instrument's colour, the upload's first (tracks.js)
  programs: null, // the General MIDI names (GET /v1/model's `programs`), for the track legend
};

export const roll = new PianoRoll($("roll"));

export const synth = new Synth(
  (t) => { roll.playhead = t; roll.draw(); },
  () => { roll.playhead = null; roll.draw(); $("stop").disabled = true; },
);
