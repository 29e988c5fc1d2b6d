// Fill's span: chosen by dragging across the roll, or typed in seconds or in bars (the seconds follow the
// file's downbeats); both inputs and the roll's band follow each other.

import { $, app, clearFieldError, fmt } from "../dom.js";
import { drawInput } from "../modes.js";
import { roll, state } from "../state.js";

// The span in bars, when it was typed as bars ([first, last], 1-based): the request sends them as such and the
// server reads them against the file; the seconds inputs show where the page counts them.
export function fillBars() {
  const first = Number($("fill_first_bar").value), last = Number($("fill_last_bar").value);
  const set = $("fill_first_bar").value.trim() !== "" && $("fill_last_bar").value.trim() !== "";
  return set && Number.isInteger(first) && Number.isInteger(last) ? [first, last] : null;
}

function clearFillBars() {
  $("fill_first_bar").value = "";
  $("fill_last_bar").value = "";
}

export function fillSpan() {
  const start = Number($("fill_start").value), end = Number($("fill_end").value);
  const set = $("fill_start").value.trim() !== "" && $("fill_end").value.trim() !== "";
  return set && Number.isFinite(start) && Number.isFinite(end) ? { start, end } : null;
}

// A first span for a file loaded in Fill: a few seconds in its middle, which has music before and after.
export function defaultFillSpan() {
  if (!state.motif || fillSpan()) return;
  const pitched = state.motif.notes.filter((n) => !n.drum);
  if (!pitched.length) return;
  const first = Math.min(...pitched.map((n) => n.start)), last = Math.max(...pitched.map((n) => n.start));
  const length = Math.min(4, Math.max(0.5, (last - first) / 3));
  const start = first + (last - first - length) / 2;
  $("fill_start").value = String(fmt(start, 2));
  $("fill_end").value = String(fmt(start + length, 2));
}

// Another file: its own first span, in place of the last file's.
export function resetFillSpan() {
  $("fill_start").value = "";
  $("fill_end").value = "";
  clearFillBars();
  defaultFillSpan();
}

function redrawFillSpan() {
  if (!state.samples.length) drawInput();
  else { roll.span = fillSpan(); roll.draw(); }
}

export function wireSpan() {
  // Dragging across the roll in Fill mode sets the span (both inputs follow).
  let spanDrag = null;
  $("roll").addEventListener("pointerdown", (e) => {
    if (state.mode !== "fill" || !state.motif || app.dataset.state === "loading") return;
    const t = roll.timeAt(e.clientX);
    if (t == null) return;
    spanDrag = { from: t, moved: false };
    $("roll").setPointerCapture(e.pointerId);
  });
  $("roll").addEventListener("pointermove", (e) => {
    if (!spanDrag) return;
    const t = roll.timeAt(e.clientX);
    if (t == null) return;
    spanDrag.moved = true;
    $("fill_start").value = String(fmt(Math.min(spanDrag.from, t), 2));
    $("fill_end").value = String(fmt(Math.max(spanDrag.from, t), 2));
    clearFillBars();
    for (const id of ["fill_start", "fill_end", "fill_first_bar", "fill_last_bar"]) clearFieldError($(id));
    roll.span = fillSpan();
    roll.draw();
  });
  $("roll").addEventListener("pointerup", () => {
    if (!spanDrag) return;
    const moved = spanDrag.moved;
    spanDrag = null;
    if (moved) redrawFillSpan();
  });
  for (const id of ["fill_start", "fill_end"]) {
    $(id).addEventListener("input", () => {
      if (state.mode !== "fill") return;
      clearFillBars();
      redrawFillSpan();
    });
  }
  // Bars typed: the seconds follow, where the file's downbeats put them (the last bar ends where the next begins).
  for (const id of ["fill_first_bar", "fill_last_bar"]) {
    $(id).addEventListener("input", () => {
      const bars = fillBars(), beats = state.motif ? state.motif.downbeats : [];
      if (state.mode !== "fill" || !bars) return;
      const [first, last] = bars;
      if (first >= 1 && first <= last && last < beats.length) {
        $("fill_start").value = String(fmt(beats[first - 1], 3));
        $("fill_end").value = String(fmt(beats[last], 3));
      }
      redrawFillSpan();
    });
  }
}
