// The page's elements and what it tells the user: the status line, the error box, and an API error beside
// the field it is about.

export const $ = (id) => document.getElementById(id);
export const app = $("app");

// Under 1 kB in bytes: a 6-byte file rounded up to "1 KB" hid that it is far too small to be MIDI.
export const fmtBytes = (b) =>
  b >= 1e6 ? `${+(b / 1e6).toFixed(1)} MB` : b >= 1e3 ? `${+(b / 1e3).toFixed(1)} KB` : `${b} bytes`;
export const fmt = (x, digits = 2) => (typeof x === "number" ? +x.toFixed(digits) : x);
export const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);

export function setState(s) { app.dataset.state = s; }

export function setStatus(text) { $("status").textContent = text; }

export function showError(message, code) {
  const box = $("error");
  box.replaceChildren();
  const strong = document.createElement("strong");
  strong.textContent = "Error: ";
  box.append(strong, document.createTextNode(message));
  if (code) {
    const c = document.createElement("code");
    c.textContent = ` (${code})`;
    box.append(c);
  }
  box.hidden = false;
}

export function clearError() { $("error").hidden = true; $("error").replaceChildren(); }

// The API names the field an error is about (`field` of a 422); its message goes next to that input too, so a
// bad chord symbol is pointed at where it was typed, with the Steer section opened if it was folded.
export function showFieldError(field, message) {
  // Two modes may name a field alike (Continue's `tracks` input, Fill's picker): the one shown takes it.
  const named = field ? [...document.querySelectorAll(`#form [name="${CSS.escape(field)}"]`)] : [];
  const el = named.find((e) => e.getClientRects().length) || named[0];
  if (!el || el.type === "file") return false;
  const box = el.closest(".field") || el.parentElement;
  let note = $(`${field}-error`);
  if (!note) {
    note = document.createElement("p");
    note.id = `${field}-error`;
    note.className = "field-error";
    box.append(note);
  }
  note.textContent = message;
  note.hidden = false;
  el.setAttribute("aria-invalid", "true");
  el.setAttribute("aria-errormessage", note.id);
  const folded = el.closest("details");
  if (folded) folded.open = true;
  return true;
}

export function clearFieldError(el) {
  const note = $(`${el.name}-error`);
  if (note) { note.hidden = true; note.textContent = ""; }
  el.removeAttribute("aria-invalid");
  el.removeAttribute("aria-errormessage");
}

export function clearFieldErrors() {
  for (const el of $("form").querySelectorAll("[aria-invalid]")) clearFieldError(el);
}
