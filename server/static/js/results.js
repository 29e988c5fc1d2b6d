// An answer on the page: its samples read from the MIDI it carries, one tab each, drawn on the roll, offered
// for download and described; and playback of what is shown. What differs by mode comes from its definition.

import { decodeBase64 } from "./api.js";
import { $, app, fmt, num, setState, setStatus, showError } from "./dom.js";
import { parseMidi } from "./midi.js";
import { markSpan, mode } from "./modes.js";
import { roll, state, synth } from "./state.js";

export function resetResult() {
  synth.stop();
  for (const s of state.samples) URL.revokeObjectURL(s.url);
  state.samples = [];
  state.response = null;
  $("download").hidden = true;
  $("result-info").hidden = true;
  $("sample-tabs").hidden = true;
  $("sample-tabs").replaceChildren();
  $("stop").disabled = true;
  $("reroll").hidden = true;
  if (app.dataset.state === "done") setState("idle");
}

// A mode's JSON answer (every sample), `elapsed` seconds after the click: the samples drawn and described.
export function showAnswer(def, body, elapsed) {
  state.kind = def.name;
  state.response = body;
  const samples = body.samples || [];
  if (!samples.length) throw Object.assign(new Error("the server returned no samples"), { code: "empty_result" });
  const base = (state.motifFile.name || def.untitled).replace(/\.(mid|midi)$/i, "");
  const seed = body.seed != null ? `-seed${body.seed}` : "";
  const split = def.split(body);
  state.samples = samples.map((s, i) => {
    const bytes = decodeBase64(s.midi_base64);
    let parsed = { notes: [], tracks: [] };
    try { parsed = state.colours.paint(parseMidi(bytes.buffer)); } catch (_) { /* drawn empty; the download is still offered */ }
    const url = URL.createObjectURL(new Blob([bytes], { type: "audio/midi" }));
    const suffix = samples.length > 1 ? `-${(s.index ?? i) + 1}` : "";
    return { bytes, url, raw: s, ...split(parsed), filename: `${base}-${def.fileTag(body)}${seed}${suffix}.mid` };
  });
  showSampleTabs();
  selectSample(0, !!def.keepsPlaying);
  if (synth.live) $("stop").disabled = false;

  const t = body.timings || {};
  const ms = ([k, label]) => (num(t[k]) != null ? `${label} ${fmt(t[k] / 1000, 3)} s` : null);
  const stages = [["parse_ms", "parse"], ["queue_ms", "queue"], ...def.stages, ["total_ms", "server total"]];
  $("info-timings").textContent = [...stages.map(ms), `round trip ${fmt(elapsed, 2)} s`,
    ...(def.timingNotes ? def.timingNotes(body) : [])].filter(Boolean).join(" · ");
  $("info-seed").textContent = body.seed ?? "—";
  const [label, text] = def.summary(body, samples);
  $("info-tokens-label").textContent = label;
  $("info-tokens").textContent = text + ((body.warnings || []).length ? ` — ${body.warnings.join("; ")}` : "");
  $("result-info").hidden = false;
  $("reroll").hidden = !def.rerolls;
  setState("done");
  setStatus(`Done in ${fmt(elapsed, 1)} s: ${def.done(body, state.samples)}`);
}

// One tab per sample when there are several (every mode alike).
function showSampleTabs() {
  const tabs = $("sample-tabs");
  tabs.replaceChildren();
  if (state.samples.length > 1) {
    state.samples.forEach((_, i) => {
      const b = document.createElement("button");
      b.type = "button";
      b.setAttribute("role", "tab");
      b.setAttribute("aria-controls", "roll");
      b.id = `sample-tab-${i}`;
      b.textContent = `Sample ${i + 1}`;
      b.addEventListener("click", () => selectSample(i));
      tabs.append(b);
    });
    tabs.hidden = false;
  }
}

function selectSample(i, keepPlaying = false) {
  if (!keepPlaying) synth.stop();
  state.current = i;
  const s = state.samples[i], def = mode(state.kind);
  for (const [j, tab] of [...$("sample-tabs").children].entries()) tab.setAttribute("aria-selected", String(i === j));
  roll.set([{ notes: s.motifNotes, role: "kept" }, { notes: s.contNotes, role: "new" }], s.boundary);
  $("roll").setAttribute("aria-label", def.rollLabel(s.motifNotes, s.contNotes, s.boundary));
  $("roll").dataset.notes = String(s.contNotes.length);
  const a = $("download");
  a.href = s.url;
  a.download = s.filename;
  markSpan(def, state.response);
  roll.draw();
  a.textContent = `Download ${state.samples.length > 1 ? `sample ${i + 1}` : def.download} (.mid)`;
  a.hidden = false;
  $("info-notes").textContent = def.noteCount(s);
  $("play-all").disabled = !(s.motifNotes.length + s.contNotes.length);
  $("play-motif").disabled = !s.motifNotes.length;
  $("play-cont").disabled = !s.contNotes.length;
}

// --- playback ---

// What the play buttons play: the shown sample's layers, else the file as loaded.
function currentLayers() {
  const s = state.samples[state.current];
  if (s) return { motif: s.motifNotes, cont: s.contNotes, boundary: s.boundary };
  return { motif: state.motif ? state.motif.notes : [], cont: [], boundary: 0 };
}

// "all", "motif" or "cont" (the play buttons); a mode with its own idea of them (Fill) plays them itself.
export function play(which) {
  const def = mode();
  try {
    if (def.play) def.play(which);
    else {
      const { motif, cont, boundary } = currentLayers();
      const notes = which === "motif" ? motif : which === "cont" ? cont : [...motif, ...cont];
      synth.play(notes, which === "cont" ? boundary || 0 : 0); // an accompaniment has no boundary: from 0
    }
    $("stop").disabled = false;
  } catch (err) {
    showError(`cannot play audio: ${err.message}`, "audio");
  }
}

export function stop() {
  synth.stop();
  roll.playhead = null;
  roll.draw();
  $("stop").disabled = true;
}

// The server's instruments model wrote the answer (an upload with drums or several instruments): the modes'
// closing line says so.
export const byInstrumentsModel = (body) =>
  body.model === "instruments" ? " Written by the instruments model, each instrument on its track." : "";
