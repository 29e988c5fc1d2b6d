// musicrel web page, the entry module (index.html loads it; native ES modules, no build step, no libraries).
// It parses MIDI itself (midi.js), draws a piano roll on a canvas (roll.js), plays notes with a small
// WebAudio synth (synth.js), and offers three modes, each one definition (modes/*.js) that the shared
// request (task.js) and answer (results.js) read. This module only wires the page together.

import { $ } from "./dom.js";
import { wireFields } from "./fields.js";
import { loadExamples, wireInput } from "./input.js";
import { parseMidi } from "./midi.js";
import { wireModeSwitch } from "./mode-switch.js";
import { drawInput, mode } from "./modes.js";
import { wireAccompany } from "./modes/accompany.js";
import { wireContinue } from "./modes/continue.js";
import { wireFill } from "./modes/fill.js";
import { wireSpan } from "./modes/span.js";
import { renderLegend } from "./legend.js";
import { play, stop } from "./results.js";
import { loadModelInfo, pollReady } from "./server.js";
import { roll, state, synth } from "./state.js";
import { cancel, submit } from "./task.js";

wireInput();
wireFields();
wireModeSwitch();
wireContinue();
wireAccompany();
wireSpan();
wireFill();

$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  submit(mode());
});
$("cancel").addEventListener("click", cancel);
$("play-all").addEventListener("click", () => play("all"));
$("play-motif").addEventListener("click", () => play("motif"));
$("play-cont").addEventListener("click", () => play("cont"));
$("stop").addEventListener("click", stop);
$("volume").addEventListener("input", () => synth.setVolume(Number($("volume").value)));

roll.onSet = renderLegend; // the track legend lists what the roll draws
drawInput();
loadExamples();
pollReady();
loadModelInfo().then(() => renderLegend(roll.layers)); // now with the programs' names

// Exposed for tests and the console; the page itself does not need it.
window.musicrel = { parseMidi, state, synth, roll };
