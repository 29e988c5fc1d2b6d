// One request, whatever the mode: the form collected and checked, sent (the mode's own request, plain or a
// stream, else a plain POST to its endpoint), the answer shown, or the failure said. A mode differs from
// another only in its definition (modes.js).

import { postJson } from "./api.js";
import { $, app, clearError, clearFieldErrors, setState, setStatus, showError, showFieldError } from "./dom.js";
import { collectForm, validateSettings } from "./fields.js";
import { drawInput } from "./modes.js";
import { resetResult, showAnswer } from "./results.js";
import { state, synth } from "./state.js";

export async function submit(def) {
  if (!state.motifFile || app.dataset.state === "loading") return;
  performance.clearMarks();
  performance.mark(`musicrel:${def.name}`);
  clearError();
  clearFieldErrors();
  const invalid = (def.check && def.check()) || validateSettings(def);
  if (invalid) { showError(invalid, "invalid_setting"); return; }
  resetResult();
  drawInput();
  setState("loading");
  $("continue").disabled = true;
  $("cancel").hidden = false;
  const started = performance.now();
  const busy = def.text.busy;
  const tick = setInterval(() => setStatus(`${busy}… ${((performance.now() - started) / 1000).toFixed(1)} s`), 100);
  setStatus(`${busy}…`);
  state.abort = new AbortController();
  const form = collectForm(def);
  // The request leaves first: starting the audio context can hold the page for 100-200 ms the first time.
  const answer = def.request ? def.request(form, state.abort.signal, started)
    : postJson(def.endpoint, form, state.abort.signal);
  try {
    // Within the click: browsers start audio only on a user's gesture (the answer plays when it comes; a
    // stream as it comes).
    if (def.startAudio) def.startAudio(); else synth.ensureContext(true);
  } catch (err) {
    showError(`cannot play audio: ${err.message}`, "audio");
  }
  try {
    const body = await answer;
    showAnswer(def, body, (performance.now() - started) / 1000);
    if (def.answered) def.answered(body);
  } catch (err) {
    showFailure(err);
  } finally {
    clearInterval(tick);
    state.abort = null;
    $("cancel").hidden = true;
    $("continue").disabled = !state.motifFile;
  }
}

export function cancel() {
  if (state.abort) state.abort.abort();
}

// How a request that failed or was cancelled ends.
function showFailure(err) {
  synth.stop();
  setState("error");
  if (err.name === "AbortError") { setStatus("Cancelled."); }
  else {
    showError(err.code ? err.message : `could not reach the server (${err.message})`, err.code || "network");
    if (err.field) showFieldError(err.field, err.message);
    setStatus("Failed — adjust and try again.");
  }
}
