// What the server says of itself: whether it is ready (GET /readyz, polled while it is not) and its model
// and limits (GET /v1/model), which the form follows (bounds, the instrument menu, the modes it offers).

import { $, fmt, fmtBytes, num } from "./dom.js";
import { setModeDefaults } from "./mode-switch.js";
import { state } from "./state.js";

export async function pollReady() {
  const banner = $("ready-banner");
  try {
    const r = await fetch("/readyz", { cache: "no-store" });
    if (r.ok) { banner.hidden = true; return; }
    banner.textContent = "The model is still loading (or the server is shutting down); requests may be refused.";
  } catch (_) {
    banner.textContent = "The server is not reachable right now.";
  }
  banner.hidden = false;
  setTimeout(pollReady, 3000);
}

// The operator may have set tighter limits than the page's defaults: follow the server.
function cap(id, value) {
  if (num(value) == null) return;
  const el = $(id);
  el.max = String(value);
  if (Number(el.value) > value) el.value = String(value);
}

export async function loadModelInfo() {
  try {
    const r = await fetch("/v1/model");
    if (!r.ok) {
      $("mode-hint").textContent = "the server did not say whether it can accompany";
      $("fill-mode-hint").textContent = "the server did not say whether it can fill spans";
      return;
    }
    const info = await r.json();
    const m = info.model || {};
    const bits = [];
    if (m.n_layers) bits.push(`${m.n_layers} layers`);
    if (m.d_model) bits.push(`d_model ${m.d_model}`);
    if (m.attention) bits.push(`${m.attention} attention`);
    if (info.parameters) bits.push(`${(info.parameters / 1e6).toFixed(info.parameters < 1e6 ? 3 : 1)} M parameters`);
    if (info.vocab_size) bits.push(`vocabulary ${info.vocab_size}`);
    if (info.sha256) bits.push(`checkpoint ${String(info.sha256).slice(0, 12)}`);
    if (bits.length) $("model-info").textContent = `Model: ${bits.join(" · ")}`;
    const limits = info.limits || {};
    cap("seconds", limits.max_seconds);
    cap("primer_seconds", limits.max_primer_seconds);
    cap("num_samples", num(limits.max_num_samples) != null && num(limits.max_batch_rows) != null
      ? Math.min(limits.max_num_samples, limits.max_batch_rows) : limits.max_num_samples);
    cap("top_k", info.vocab_size);
    // The instrument menu: the General MIDI names as the library knows them (musicrel.controls).
    if (Array.isArray(info.programs)) state.programs = info.programs; // the track legend's names too
    if (Array.isArray(info.programs) && $("program").options.length === 1) {
      info.programs.forEach((name, program) => {
        const opt = document.createElement("option");
        opt.value = String(program);
        opt.textContent = `${program} ${name}`;
        $("program").append(opt);
      });
    }
    // Fill is offered when the server has an infill model (POST /v1/infills); otherwise it stays disabled.
    const inf = info.infill;
    $("mode-fill").disabled = !inf;
    $("fill-mode-hint").textContent = inf
      ? `spans up to ${fmt(inf.max_span_seconds, 0)} s`
      : "this server has no infill model";
    // Accompany is offered when the server has an accompaniment model (POST /v1/accompaniments).
    const acc = info.accompaniment;
    if (limits.defaults) setModeDefaults("continue", limits.defaults);
    if (acc && acc.defaults) setModeDefaults("accompany", acc.defaults);
    $("mode-accompany").disabled = !acc;
    $("mode-hint").textContent = acc
      ? `melodies up to ${fmt(acc.max_melody_seconds, 0)} s`
      : "this server has no accompaniment model";
    if (num(limits.max_upload_bytes) != null) {
      $("upload-hint").textContent = `.mid / .midi, up to ${fmtBytes(limits.max_upload_bytes)}`;
    }
  } catch (_) { /* the footer line and limits are optional */ }
}
