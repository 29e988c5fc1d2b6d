// The API client: a form posted to a plain endpoint or to a stream endpoint (NDJSON read event by event),
// the server's errors read into one shape (an Error with the API's `code` and the `field` it is about), and
// the answer's MIDI decoded.

// Streaming itself did not work (no such route, a proxy that cuts or buffers the stream, a browser without
// readable streams): the caller may ask the plain endpoint instead. Not the server's verdict on the request.
export class StreamFailed extends Error {}

export function decodeBase64(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

const failure = (message, code, field = null) => Object.assign(new Error(message), { code, field });

// A refused request as the Error the page shows: the API's {error: {code, message, field}}, FastAPI's own
// validation shape, or the HTTP status when the body is neither.
async function apiError(resp) {
  let code = `http_${resp.status}`;
  let message = resp.statusText || `the server answered HTTP ${resp.status}`;
  let field = null;
  try {
    const body = await resp.json();
    const err = body && body.error;
    if (err) { code = err.code || code; message = err.message || message; field = err.field || null; }
    else if (body && body.detail) {
      // FastAPI's own validation shape: [{loc, msg}] -> "seconds: Input should be ..."
      message = Array.isArray(body.detail)
        ? body.detail.map((d) => `${(d.loc || []).filter((l) => l !== "body").join(".")}: ${d.msg}`).join("; ")
        : String(body.detail);
    }
  } catch (_) { /* not JSON: keep the HTTP status text */ }
  const retry = resp.headers.get("Retry-After");
  if (retry) message += ` (retry in ${retry} s)`;
  return failure(message, code, field);
}

// A GET whose answer is optional (examples, model facts, a prepared motif): its JSON, or null on any failure.
export const fetchJson = (url, init) =>
  fetch(url, init).then((r) => (r.ok ? r.json() : null)).catch(() => null);

// A form to a plain endpoint: its JSON answer (every sample at once), or the API's error thrown.
export async function postJson(url, form, signal) {
  const resp = await fetch(url, { method: "POST", body: form, headers: { Accept: "application/json" }, signal });
  if (!resp.ok) throw await apiError(resp);
  return resp.json();
}

// A form to a stream endpoint: the response, ready for streamEvents. StreamFailed where streaming did not
// work, the API's error where the server refused the request (the plain endpoint would say the same).
export async function openStream(url, form, signal) {
  let resp;
  try {
    resp = await fetch(url, { method: "POST", body: form, signal });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new StreamFailed(`the stream request failed (${err.message})`);
  }
  if ([404, 405, 501].includes(resp.status)) throw new StreamFailed(`no stream endpoint (HTTP ${resp.status})`);
  if (!resp.ok) throw await apiError(resp);
  if (!resp.body || !resp.body.getReader) throw new StreamFailed("this browser cannot read a response as it arrives");
  return resp;
}

// The stream's events, one NDJSON line each, up to and including its `result` (the plain endpoint's JSON);
// an `error` event is thrown as the API's error, a stream that breaks off or ends early as StreamFailed.
export async function* streamEvents(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (err) {
        if (err.name === "AbortError") throw err;
        throw new StreamFailed(`the stream broke off (${err.message})`);
      }
      if (chunk.done) break;
      buffer += decoder.decode(chunk.value, { stream: true });
      let nl;
      while ((nl = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + 1);
        if (!line.trim()) continue;
        let event;
        try { event = JSON.parse(line); } catch (_) { throw new StreamFailed("the stream sent a line that is not JSON"); }
        if (event.type === "error") {
          const err = event.error || {};
          throw failure(err.message || `HTTP ${event.status}`, err.code || `http_${event.status}`, err.field || null);
        }
        yield event;
        if (event.type === "result") return;
      }
    }
  } finally {
    reader.cancel().catch(() => {}); // the result is in: the rest of the body is not waited for
  }
  throw new StreamFailed("the stream ended before its result");
}
