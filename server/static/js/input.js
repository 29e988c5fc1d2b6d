// The file to work on: chosen, dropped or picked from the examples, read by the page's own parser for the
// roll (the server's verdict on it is the one that counts), and handed to every mode.

import { fetchJson } from "./api.js";
import { $, clearError, fmt, fmtBytes, setStatus, showError } from "./dom.js";
import { parseMidi } from "./midi.js";
import { drawInput, mode, modes } from "./modes.js";
import { resetResult } from "./results.js";
import { state, synth } from "./state.js";

async function loadMotif(file, sourceLabel) {
  clearError();
  resetResult();
  state.motifFile = file;
  state.motif = null;
  state.prepared = null;
  state.preparedInfo = null;
  try {
    state.motif = parseMidi(await file.arrayBuffer());
    state.colours.reset(state.motif);
    const m = state.motif;
    const pitched = m.notes.filter((n) => !n.drum).length;
    $("motif-info").textContent = `${sourceLabel}: ${file.name} — ${m.notes.length} notes` +
      `${pitched !== m.notes.length ? ` (${m.notes.length - pitched} drum)` : ""}, ` +
      `${fmt(m.duration, 1)} s, ${m.noteTracks} track${m.noteTracks === 1 ? "" : "s"} with notes, ${Math.round(m.bpm)} bpm`;
  } catch (err) {
    // The browser's parser is only for the preview; the server's verdict is the one that counts.
    state.motif = null;
    state.colours.reset(null);
    $("motif-info").textContent = `${sourceLabel}: ${file.name} (${fmtBytes(file.size)}) — ` +
      `cannot preview it here (${err.message}); the server will check it.`;
  }
  for (const def of modes()) if (def.loaded) def.loaded();
  drawInput();
  if (state.motif) warmAudio();
  $("continue").disabled = false;
  setStatus(mode().text.ready);
}

// Opening the audio device holds the page 100-200 ms the first time: done while the user reads the roll, not
// between Continue and the first note. Made outside a gesture, the context starts suspended; Continue resumes
// it (browsers start audio only on a user's gesture).
function warmAudio() {
  try {
    synth.ensureContext(false);
  } catch {
    // no Web Audio: Continue reports it
  }
}

const examples = new Map();

export async function loadExamples() {
  // The API's list first (it checks the files exist); the static index when the API is not there.
  let list = await fetchJson("/v1/examples");
  if (!Array.isArray(list) || !list.length) {
    const index = await fetchJson("/static/examples/index.json");
    list = (Array.isArray(index) ? index : []).map((e) => ({ ...e, url: `/static/examples/${e.file}` }));
  }
  const select = $("example");
  for (const e of list) {
    const file = e.file || (e.url || "").split("/").pop();
    if (!file || examples.has(file)) continue;
    examples.set(file, { name: e.name || file, url: e.url, description: e.description || "" });
    const opt = document.createElement("option");
    opt.value = file;
    opt.textContent = e.name || file;
    select.append(opt);
  }
}

export function wireInput() {
  const fromUser = (f, sourceLabel) => {
    if (!f) return;
    $("example").value = "";
    $("example-description").textContent = "";
    loadMotif(f, sourceLabel);
  };
  $("file").addEventListener("change", () => fromUser($("file").files[0], "Uploaded"));

  const dz = $("dropzone");
  for (const ev of ["dragenter", "dragover"]) {
    dz.addEventListener(ev, (e) => { e.preventDefault(); dz.classList.add("dragover"); });
  }
  for (const ev of ["dragleave", "drop"]) dz.addEventListener(ev, () => dz.classList.remove("dragover"));
  dz.addEventListener("drop", (e) => {
    e.preventDefault();
    fromUser(e.dataTransfer.files[0], "Dropped");
  });
  // A file dropped outside the zone would otherwise navigate away from the page.
  window.addEventListener("dragover", (e) => e.preventDefault());
  window.addEventListener("drop", (e) => e.preventDefault());

  $("example").addEventListener("change", async () => {
    const e = examples.get($("example").value);
    $("example-description").textContent = e ? e.description : "";
    if (!e) return;
    try {
      const r = await fetch(e.url);
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      const blob = await r.blob();
      $("file").value = "";
      await loadMotif(new File([blob], $("example").value, { type: "audio/midi" }), "Example");
    } catch (err) {
      showError(`could not load the example ${e.name}: ${err.message}`);
    }
  });
}
