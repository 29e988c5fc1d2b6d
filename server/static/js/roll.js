// Piano roll on a canvas (device-pixel-ratio aware; redrawn on resize and for the playhead): the grid, axes,
// span, boundary and playhead here, the notes in their tracks' colours and the drum lane in roll-notes.js.

import { drawDrumLane, drawNotes, drumLane } from "./roll-notes.js";

const NOTE_NAMES = ["C", "C♯", "D", "D♯", "E", "F", "F♯", "G", "G♯", "A", "A♯", "B"];
export const pitchName = (p) => NOTE_NAMES[p % 12] + (Math.floor(p / 12) - 1);

function niceStep(span, target) {
  const raw = span / target;
  const pow = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (raw <= m * pow) return m * pow;
  return 10 * pow;
}

export class PianoRoll {
  constructor(canvas) {
    this.canvas = canvas;
    this.layers = []; // {notes, role}: role "new" (the answer's new notes, outlined) or "kept"
    this.onSet = null; // called with the layers each time they change (the track legend follows them)
    this.boundary = null; // seconds where the continuation starts
    this.playhead = null;
    this.span = null; // Fill: {start, end} seconds, drawn as a band
    this.bars = null; // Fill: every bar's start in seconds (the file's downbeats), ticked and numbered on top
    new ResizeObserver(() => this.draw()).observe(canvas);
  }

  // Seconds at a clientX over the canvas (Fill's drag), clamped to the drawn time axis; null before a draw.
  timeAt(clientX) {
    if (!this.view) return null;
    const { left, pw, tEnd } = this.view;
    const r = this.canvas.getBoundingClientRect();
    return Math.min(tEnd, Math.max(0, ((clientX - r.left - left) / pw) * tEnd));
  }

  set(layers, boundary, shadeUntil = null, shadeFrom = null) {
    this.layers = layers;
    this.boundary = boundary;
    this.shadeUntil = shadeUntil; // seconds before the primer window: drawn dimmed
    this.shadeFrom = shadeFrom; // seconds after the motif's end (motif_end): drawn dimmed too
    this.playhead = null;
    if (this.onSet) this.onSet(layers);
    this.draw();
  }

  draw() {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth, h = c.clientHeight;
    if (!w || !h) return;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(h * dpr);
    }
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const css = getComputedStyle(document.documentElement);
    const color = (v) => css.getPropertyValue(v).trim();
    ctx.fillStyle = color("--roll-bg");
    ctx.fillRect(0, 0, w, h);

    const all = this.layers.flatMap((l) => l.notes);
    const left = 40, bottom = 22, top = 8, right = 10;
    const pw = w - left - right, ph = h - top - bottom;
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = color("--muted");
    if (!all.length) {
      ctx.textAlign = "center";
      ctx.fillText("Load a motif to see its piano roll", w / 2, h / 2);
      return;
    }
    const pitched = all.filter((n) => !n.drum);
    let lo = pitched.reduce((m, n) => Math.min(m, n.pitch), pitched.length ? 127 : 48);
    let hi = pitched.reduce((m, n) => Math.max(m, n.pitch), pitched.length ? 0 : 72);
    lo = Math.max(0, lo - 2); hi = Math.min(127, hi + 2);
    if (hi - lo < 24) { const pad = Math.ceil((24 - (hi - lo)) / 2); lo = Math.max(0, lo - pad); hi = Math.min(127, hi + pad); }
    const tEnd = all.reduce((m, n) => Math.max(m, n.end), 1);
    const lane = drumLane(all, top, ph);
    const pitchH = lane ? lane.top - top - 3 : ph; // the pitches above the drum lane
    const x = (t) => left + (t / tEnd) * pw;
    const rowH = pitchH / (hi - lo + 1);
    const y = (p) => top + (hi - p) * rowH;
    this.view = { left, top, pw, ph, tEnd, lo, hi, rowH, lane };

    // Black-key rows shaded, C rows labelled: the usual piano-roll orientation aids.
    for (let p = lo; p <= hi; p++) {
      if ([1, 3, 6, 8, 10].includes(p % 12)) {
        ctx.fillStyle = color("--roll-grid");
        ctx.globalAlpha = 0.45;
        ctx.fillRect(left, y(p), pw, rowH);
        ctx.globalAlpha = 1;
      }
      if (p % 12 === 0) {
        ctx.fillStyle = color("--roll-grid");
        ctx.fillRect(left, y(p) + rowH - 1, pw, 1);
        ctx.fillStyle = color("--muted");
        ctx.textAlign = "right";
        ctx.textBaseline = "middle";
        if (rowH * 12 > 14) ctx.fillText(pitchName(p), left - 5, y(p) + rowH / 2);
      }
    }
    // Time axis.
    const step = niceStep(tEnd, Math.max(3, Math.floor(pw / 70)));
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (let t = 0; t <= tEnd + 1e-9; t += step) {
      ctx.fillStyle = color("--roll-grid");
      ctx.fillRect(Math.round(x(t)), top, 1, ph);
      ctx.fillStyle = color("--muted");
      ctx.fillText(`${+t.toFixed(2)} s`, x(t), top + ph + 5);
    }
    // Bars (Fill, where a span can be typed in bars): a tick at each downbeat, numbered as often as fits.
    if (this.bars && this.bars.length > 1) {
      const every = Math.max(1, Math.ceil(24 / (pw * (this.bars[1] - this.bars[0]) / tEnd)));
      ctx.textAlign = "left";
      this.bars.forEach((t, i) => {
        if (t > tEnd) return;
        ctx.fillStyle = color("--muted");
        ctx.fillRect(Math.round(x(t)), top, 1, 6);
        if (i % every === 0) ctx.fillText(String(i + 1), Math.round(x(t)) + 2, top);
      });
    }
    ctx.save();
    ctx.translate(10, top + ph / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    ctx.fillText("pitch", 0, 0);
    ctx.restore();

    const geometry = { left, pw, x, y, rowH, lane };
    const span = this.span && this.span.end > this.span.start ? this.span : null;
    if (span) { // under the notes, which keep their tracks' colours in it
      ctx.fillStyle = color("--cont");
      ctx.globalAlpha = 0.14;
      ctx.fillRect(x(span.start), top, Math.max(2, x(span.end) - x(span.start)), ph);
      ctx.globalAlpha = 1;
    }
    drawDrumLane(ctx, geometry, color);
    drawNotes(ctx, this.layers, geometry, color);
    if (this.shadeUntil > 0) {
      ctx.fillStyle = color("--roll-bg");
      ctx.globalAlpha = 0.7;
      ctx.fillRect(left, top, x(this.shadeUntil) - left, ph);
      ctx.globalAlpha = 1;
      ctx.fillStyle = color("--muted");
      ctx.textAlign = "left";
      ctx.textBaseline = "top";
      if (x(this.shadeUntil) - left > 150) ctx.fillText("before the primer window", left + 6, top + 4);
    }
    if (this.shadeFrom != null && x(this.shadeFrom) < left + pw) {
      ctx.fillStyle = color("--roll-bg");
      ctx.globalAlpha = 0.7;
      ctx.fillRect(x(this.shadeFrom), top, left + pw - x(this.shadeFrom), ph);
      ctx.globalAlpha = 1;
      ctx.fillStyle = color("--muted");
      ctx.textAlign = "left";
      ctx.textBaseline = "top";
      if (left + pw - x(this.shadeFrom) > 150) ctx.fillText("after the motif's end", x(this.shadeFrom) + 6, top + 4);
    }
    if (span) {
      ctx.strokeStyle = color("--text");
      for (const t of [span.start, span.end]) {
        ctx.beginPath();
        ctx.moveTo(Math.round(x(t)) + 0.5, top);
        ctx.lineTo(Math.round(x(t)) + 0.5, top + ph);
        ctx.stroke();
      }
    }
    if (this.boundary != null) {
      ctx.strokeStyle = color("--text");
      ctx.setLineDash([4, 4]);
      ctx.beginPath();
      ctx.moveTo(Math.round(x(this.boundary)) + 0.5, top);
      ctx.lineTo(Math.round(x(this.boundary)) + 0.5, top + ph);
      ctx.stroke();
      ctx.setLineDash([]);
    }
    if (this.playhead != null) {
      ctx.fillStyle = "#e0245e";
      ctx.fillRect(x(Math.min(this.playhead, tEnd)) - 1, top, 2, ph);
    }
  }
}
