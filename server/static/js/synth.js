// A small WebAudio synth: one oscillator + ADSR gain per note (its wave by the note's program), drums as
// filtered noise bursts. Notes are scheduled a little ahead of time in slices so long pieces do not create
// thousands of nodes at once.

// A wave for each General MIDI family of eight programs, enough to tell a band's tracks apart: bass and pipes
// round, strings, ensembles and brass bright, reeds hollow; pianos and the rest a soft triangle.
const WAVES = { 4: "sine", 5: "sawtooth", 6: "sawtooth", 7: "sawtooth", 8: "square", 9: "sine" };

export class Synth {
  constructor(onTick, onEnd) {
    this.ctx = null;
    this.timer = null;
    this.nodes = new Set();
    this.onTick = onTick;
    this.onEnd = onEnd;
    this.volume = 0.6;
    this.live = null; // a stream being played as it arrives (startLive)
  }

  ensureContext(resume = true) {
    if (!this.ctx) {
      const Ctx = window.AudioContext || window.webkitAudioContext;
      if (!Ctx) throw new Error("this browser has no Web Audio support");
      this.ctx = new Ctx();
      this.master = this.ctx.createGain();
      this.master.gain.value = this.volume;
      const comp = this.ctx.createDynamicsCompressor(); // dense chords would otherwise clip
      this.master.connect(comp).connect(this.ctx.destination);
      const len = this.ctx.sampleRate * 0.3;
      this.noise = this.ctx.createBuffer(1, len, this.ctx.sampleRate);
      const ch = this.noise.getChannelData(0);
      for (let i = 0; i < len; i++) ch[i] = Math.random() * 2 - 1;
    }
    if (resume && this.ctx.state === "suspended") this.ctx.resume();
    return this.ctx;
  }

  setVolume(v) {
    this.volume = v;
    if (this.master) this.master.gain.setTargetAtTime(v, this.ctx.currentTime, 0.02);
  }

  play(notes, from = 0) {
    this.stop();
    const ctx = this.ensureContext();
    const sorted = notes.filter((n) => n.end > from).sort((a, b) => a.start - b.start);
    const t0 = ctx.currentTime + 0.08 - from;
    const total = sorted.reduce((m, n) => Math.max(m, n.end), from);
    let i = 0;
    const pump = () => {
      const horizon = ctx.currentTime + 1.0 - t0;
      while (i < sorted.length && sorted[i].start < horizon) this.voice(sorted[i++], t0);
      const now = ctx.currentTime - t0;
      this.onTick(now);
      if (now > total + 0.3) { this.stop(); this.onEnd(); }
    };
    pump();
    this.timer = setInterval(pump, 50);
  }

  voice(n, t0) {
    const start = Math.max(this.ctx.currentTime, t0 + n.start);
    const v = this.strike(n, start);
    if (v) this.release(v, t0 + n.end);
  }

  // A note from `start` (audio time) on, its end still unknown (a stream's notes come so): `release` ends
  // it. Drums are short bursts that end by themselves (null).
  strike(n, start) {
    const ctx = this.ctx;
    const peak = 0.05 + 0.22 * (n.velocity / 127);
    const g = ctx.createGain();
    g.connect(this.master);
    let src;
    if (n.drum) {
      src = ctx.createBufferSource();
      src.buffer = this.noise;
      const f = ctx.createBiquadFilter();
      f.type = n.pitch < 40 ? "lowpass" : "highpass";
      f.frequency.value = n.pitch < 40 ? 200 : 3000;
      src.connect(f).connect(g);
      g.gain.setValueAtTime(peak, start);
      g.gain.exponentialRampToValueAtTime(0.001, start + 0.15);
      src.start(start);
      src.stop(start + 0.2);
    } else {
      src = ctx.createOscillator();
      src.type = WAVES[n.program >> 3] || "triangle";
      const top = src.type === "sawtooth" || src.type === "square" ? peak * 0.5 : peak; // as loud as a triangle
      src.frequency.value = 440 * 2 ** ((n.pitch - 69) / 12);
      src.connect(g);
      g.gain.setValueAtTime(0, start);
      g.gain.linearRampToValueAtTime(top, start + 0.01);
      g.gain.setTargetAtTime(top * 0.45, start + 0.01, 0.25); // piano-ish decay while held
      src.start(start);
    }
    this.nodes.add(src);
    src.onended = () => { this.nodes.delete(src); g.disconnect(); };
    return n.drum ? null : { src, g, start };
  }

  release(v, end) {
    const at = Math.max(end, v.start + 0.05, this.ctx.currentTime);
    v.g.gain.cancelScheduledValues(at);
    v.g.gain.setTargetAtTime(0, at, 0.06);
    v.src.stop(at + 0.4);
  }

  // Live playback of a stream: the first onset sounds `lead` seconds after it arrives and the others keep
  // their distance from it. A note that arrives too late for its place (generation fell behind playback)
  // moves the rest of the timeline later by as much, so the rhythm stays.
  startLive(lead) {
    this.stop();
    const ctx = this.ensureContext();
    // offset: where the continuation starts on the roll (the playhead is drawn there + the live time)
    this.live = { t0: null, lead, voices: new Map(), total: null, slips: 0, first: null, offset: 0 };
    this.timer = setInterval(() => {
      const L = this.live;
      if (!L || L.t0 == null) return;
      const now = ctx.currentTime - L.t0;
      this.onTick(now + L.offset);
      if (L.total != null && now > L.total + 0.3) { this.stop(); this.onEnd(); }
    }, 50);
  }

  liveOn(id, n) {
    const L = this.live;
    if (!L) return null;
    const now = this.ctx.currentTime;
    if (L.t0 == null) L.t0 = now + L.lead - n.start;
    let start = L.t0 + n.start;
    if (start < now + 0.005) {
      L.t0 += now + 0.005 - start;
      start = now + 0.005;
      L.slips++;
    }
    const v = this.strike(n, start);
    if (v) L.voices.set(id, v);
    if (!L.first) {
      // When the first note sounds, on the page's clock: its audio time, plus the output's own latency.
      const latency = (this.ctx.baseLatency || 0) + (this.ctx.outputLatency || 0);
      L.first = { scheduledAt: performance.now(), soundsAt: performance.now() + 1000 * (start - now + latency) };
    }
    return start;
  }

  liveOff(id, end) {
    const L = this.live;
    const v = L && L.voices.get(id);
    if (!v) return;
    L.voices.delete(id);
    this.release(v, L.t0 + end);
  }

  liveDrop(id) {
    const L = this.live;
    const v = L && L.voices.get(id);
    if (!v) return;
    L.voices.delete(id);
    v.src.stop(Math.max(this.ctx.currentTime, v.start));
  }

  // The stream is complete: playback ends after the last note (`total`, seconds of the continuation).
  liveEnd(total) { if (this.live) this.live.total = total; }

  stop() {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    this.live = null;
    for (const src of this.nodes) { try { src.stop(); } catch (_) { /* already stopped */ } }
    this.nodes.clear();
  }
}
