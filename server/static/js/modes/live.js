// Continue's stream (POST /v1/continuations/stream) followed live: each note of the first sample is played
// and drawn as it arrives, open notes reaching as far as the stream has got; the final event is the answer.

import { openStream, streamEvents } from "../api.js";
import { $, app, num, setStatus } from "../dom.js";
import { roll, state, synth } from "../state.js";
import { instrumentKeys } from "../tracks.js";

// The first note sounds this long after it arrives: room for the next notes' jitter (a chord's notes come a
// few decoding steps apart, ~5-10 ms each); a note later than that moves the timeline (synth.live.slips).
export const LIVE_LEAD_S = 0.06;

// Resolves with the stream's result (the plain endpoint's JSON); rejects with the API's error, or with
// StreamFailed when streaming did not work.
export async function streamContinuation(url, form, signal) {
  const resp = await openStream(url, form, signal);
  state.stream.headersAt = performance.now();
  const live = new LiveRoll();
  for await (const event of streamEvents(resp)) {
    if (event.type === "result") {
      state.stream.resultAt = performance.now();
      return event;
    }
    live.handle(event);
  }
  return null; // not reached: streamEvents ends with the result or throws
}

class LiveRoll {
  constructor() {
    this.boundary = 0;
    this.notes = new Map(); // id -> drawn note (first sample)
    this.tracks = new Map(); // the answer's track index -> {name, program, drum, key}
    this.cont = [];
    state.stream.liveNotes = this.cont; // what has been heard (tests compare it with the result)
    this.motif = [];
    this.clock = 0; // seconds of the continuation the stream has reached
    this.pending = false;
  }

  handle(e) {
    if (e.type === "start") return this.start(e);
    if (e.sample !== 0) return; // the other samples are shown from the result
    if (e.type === "note_on") {
      // A model with instruments says each note's track and instrument (128: drums); else the motif's program.
      const drum = e.instrument === 128, program = drum ? 0 : num(e.instrument) ?? this.program;
      const track = this.tracks.get(e.track);
      const slot = track ? state.colours.slotFor(track.key, track, false) : state.colours.slotOfProgram(program, drum);
      const n = { pitch: e.pitch, velocity: e.velocity, start: this.boundary + e.time, end: null, program, drum, slot };
      this.notes.set(e.id, n);
      this.cont.push(n);
      this.clock = Math.max(this.clock, e.time);
      synth.liveOn(e.id, { pitch: e.pitch, velocity: e.velocity, start: e.time, program, drum });
      if (state.stream.notes++ === 0) {
        state.stream.firstNoteAt = performance.now();
        performance.mark("musicrel:first-note");
        if (synth.live && synth.live.first) Object.assign(state.stream, synth.live.first);
        setStatus("Playing as it is generated…");
      }
    } else if (e.type === "note_off") {
      const n = this.notes.get(e.id);
      if (n) n.end = this.boundary + e.time;
      this.clock = Math.max(this.clock, e.time);
      synth.liveOff(e.id, e.time);
    } else if (e.type === "note_drop") {
      const n = this.notes.get(e.id);
      this.notes.delete(e.id);
      if (n) this.cont.splice(this.cont.indexOf(n), 1);
      synth.liveDrop(e.id);
    }
    $("roll").dataset.liveNotes = String(this.cont.length);
    this.redraw();
  }

  start(e) {
    state.stream.startAt = performance.now();
    state.stream.seed = e.seed;
    const p = e.primer || {};
    this.program = num(e.settings && e.settings.program) ?? num(p.program) ?? 0; // the program field's, if set
    // A model with instruments: the answer's tracks, which a note's `track` names (keyed as the result's will be).
    const tracks = Array.isArray(e.tracks) ? e.tracks : [];
    const keys = instrumentKeys({ instruments: tracks });
    this.tracks = new Map(tracks.map((t, i) => [t.index, { ...t, key: keys[i] }]));
    const winStart = num(p.start_time) ?? 0;
    this.boundary = (num(p.end_time) ?? 0) - winStart;
    if (synth.live) synth.live.offset = this.boundary;
    this.motif = state.motif ? state.motif.notes
      .filter((n) => (tracks.length || !n.drum) && n.end > winStart) // a piano model hears no drums
      .map((n) => ({ ...n, start: Math.max(0, n.start - winStart), end: n.end - winStart })) : [];
    this.redraw();
  }

  redraw() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      if (app.dataset.state !== "loading") return; // the result has taken over the roll
      const until = this.boundary + this.clock;
      const drawn = this.cont.map((n) => (n.end == null ? { ...n, end: Math.max(n.start + 0.05, until) } : n));
      const playhead = roll.playhead;
      roll.set([{ notes: this.motif, role: "kept" }, { notes: drawn, role: "new" }], this.boundary);
      roll.playhead = playhead;
    });
  }
}
