// Standard MIDI File parser: header, tracks, running status, note on/off, tempo map -> seconds. The page's own
// reading of a file, for the roll and the player; the server's verdict on a file is the one that counts.

class MidiParseError extends Error {}

export function parseMidi(buffer) {
  const data = new Uint8Array(buffer);
  let pos = 0;
  const need = (n) => {
    if (pos + n > data.length) throw new MidiParseError("the file ends in the middle of a MIDI chunk");
  };
  const u8 = () => { need(1); return data[pos++]; };
  const u16 = () => { need(2); const v = (data[pos] << 8) | data[pos + 1]; pos += 2; return v; };
  const u32 = () => { need(4); const v = ((data[pos] << 24) >>> 0) + (data[pos + 1] << 16) + (data[pos + 2] << 8) + data[pos + 3]; pos += 4; return v; };
  const tag = () => { need(4); const s = String.fromCharCode(...data.subarray(pos, pos + 4)); pos += 4; return s; };
  const varlen = () => {
    let v = 0;
    for (let i = 0; i < 4; i++) {
      const b = u8();
      v = (v << 7) | (b & 0x7f);
      if (!(b & 0x80)) return v;
    }
    throw new MidiParseError("variable-length quantity longer than 4 bytes");
  };

  if (data.length < 14 || tag() !== "MThd") throw new MidiParseError("not a MIDI file (no MThd header)");
  const headerLen = u32();
  const format = u16();
  const nTracks = u16();
  const division = u16();
  pos = 8 + headerLen;
  if (division === 0) throw new MidiParseError("MIDI header has a zero time division");
  const smpte = (division & 0x8000) !== 0;
  // SMPTE division: ticks are a fixed fraction of a second and tempo events do not apply.
  const smpteTickSeconds = smpte ? 1 / ((256 - (division >> 8)) * (division & 0xff)) : 0;

  const tracks = [];
  const tempos = []; // {tick, usPerQuarter}
  const meters = []; // time signatures: {tick, numerator, denominator}
  for (let t = 0; t < nTracks && pos < data.length; t++) {
    const id = tag();
    const len = u32();
    const end = Math.min(pos + len, data.length);
    if (id !== "MTrk") { pos = end; t--; continue; } // unknown chunks are skipped, per the SMF spec
    const events = [];
    let name = "";
    let tick = 0;
    let status = 0;
    while (pos < end) {
      tick += varlen();
      let b = u8();
      if (b === 0xff) {
        const type = u8();
        const mlen = varlen();
        need(mlen);
        if (type === 0x51 && mlen === 3 && tracks.length === 0) { // tempo lives in track 0 (SMF 0 and 1)
          tempos.push({ tick, usPerQuarter: (data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2] });
        } else if (type === 0x58 && mlen >= 2 && tracks.length === 0 && data[pos] > 0) { // time signature
          meters.push({ tick, numerator: data[pos], denominator: 2 ** data[pos + 1] });
        } else if (type === 0x03 && !name) {
          name = new TextDecoder("latin1").decode(data.subarray(pos, pos + mlen));
        }
        pos += mlen;
        if (type === 0x2f) break;
        continue;
      }
      if (b === 0xf0 || b === 0xf7) { const slen = varlen(); need(slen); pos += slen; continue; }
      if (b < 0x80) {
        if (!status) throw new MidiParseError("data byte without a status (bad running status)");
        pos--; // running status: this byte is the first data byte
        b = status;
      } else if (b < 0xf0) {
        status = b;
      } else {
        continue; // system common / realtime bytes carry no note data here
      }
      const kind = b & 0xf0;
      const channel = b & 0x0f;
      const d1 = u8();
      const d2 = kind === 0xc0 || kind === 0xd0 ? 0 : u8();
      if (d1 > 127 || d2 > 127) throw new MidiParseError("MIDI data byte out of range");
      events.push({ tick, kind, channel, d1, d2 });
    }
    pos = end;
    tracks.push({ name, events });
  }
  if (!tracks.length) throw new MidiParseError("the MIDI file has no tracks");

  // Tempo map: cumulative seconds at each tempo change, so tick -> seconds is a binary search.
  tempos.sort((a, b) => a.tick - b.tick);
  const map = [{ tick: 0, seconds: 0, spt: 500000 / 1e6 / division }];
  for (const tc of tempos) {
    const last = map[map.length - 1];
    const seconds = last.seconds + (tc.tick - last.tick) * last.spt;
    const entry = { tick: tc.tick, seconds, spt: tc.usPerQuarter / 1e6 / division };
    if (tc.tick === last.tick) map[map.length - 1] = entry; else map.push(entry);
  }
  const toSeconds = (tick) => {
    if (smpte) return tick * smpteTickSeconds;
    let lo = 0, hi = map.length - 1;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (map[mid].tick <= tick) lo = mid; else hi = mid - 1; }
    return map[lo].seconds + (tick - map[lo].tick) * map[lo].spt;
  };

  // Note pairing follows pretty_midi (which the server's codec reads with), so the page draws what the model
  // hears: a note-off closes every open note of its pitch and channel begun at an earlier tick.
  const notes = [];
  // Instrument indices as pretty_midi numbers them (the `track` field of POST /v1/accompaniments): one per
  // (track, program, channel), in the order their first note is closed, track after track.
  const instruments = new Map(); // "track/program/channel" -> {index, track, program, channel, notes}
  tracks.forEach((track, ti) => {
    const open = new Map(); // channel * 128 + pitch -> [{tick, velocity, program}]
    const program = new Array(16).fill(0);
    for (const ev of track.events) {
      if (ev.kind === 0xc0) { program[ev.channel] = ev.d1; continue; }
      const key = ev.channel * 128 + ev.d1;
      if (ev.kind === 0x90 && ev.d2 > 0) {
        if (!open.has(key)) open.set(key, []);
        open.get(key).push({ tick: ev.tick, velocity: ev.d2, program: program[ev.channel] });
      } else if ((ev.kind === 0x80 || ev.kind === 0x90) && open.has(key)) {
        const pending = open.get(key);
        const close = pending.filter((on) => on.tick !== ev.tick);
        const keep = pending.filter((on) => on.tick === ev.tick);
        for (const on of close) {
          const ikey = `${ti}/${program[ev.channel]}/${ev.channel}`;
          if (!instruments.has(ikey)) {
            instruments.set(ikey, { index: instruments.size, track: ti, name: track.name, program: program[ev.channel],
              channel: ev.channel, drum: ev.channel === 9, notes: 0 });
          }
          const inst = instruments.get(ikey);
          inst.notes++;
          notes.push({ pitch: ev.d1, start: toSeconds(on.tick), end: toSeconds(ev.tick), velocity: on.velocity,
            channel: ev.channel, track: ti, program: on.program, drum: ev.channel === 9, instrument: inst.index });
        }
        if (close.length && keep.length) open.set(key, keep); else open.delete(key);
      }
    }
  });
  notes.sort((a, b) => a.start - b.start || a.pitch - b.pitch);
  const duration = notes.reduce((m, n) => Math.max(m, n.end), 0);
  const bpm = tempos.length ? 60e6 / tempos[0].usPerQuarter : 120;
  const used = new Set(notes.map((n) => n.track));
  return { format, division, tracks: tracks.map((t) => t.name), noteTracks: used.size, notes, duration, bpm,
    instruments: [...instruments.values()], downbeats: downbeats(meters, duration, division, smpte, toSeconds) };
}

// Every bar's start in seconds up to the music's end, as pretty_midi's get_downbeats counts them (the server
// reads a span in bars with it; the page only draws it): 4/4 until the first time signature, a new bar at each
// change. An SMPTE file has no beats: none.
function downbeats(meters, duration, division, smpte, toSeconds) {
  if (smpte) return [];
  meters.sort((a, b) => a.tick - b.tick);
  if (!meters.length || meters[0].tick > 0) meters.unshift({ tick: 0, numerator: 4, denominator: 4 });
  const out = [];
  meters.forEach((m, i) => {
    const bar = division * 4 * m.numerator / m.denominator;
    const until = i + 1 < meters.length ? meters[i + 1].tick : Infinity;
    for (let tick = m.tick; tick < until; tick += bar) {
      const at = toSeconds(tick);
      if (at > duration || out.length > 100000) return;
      out.push(at);
    }
  });
  return out;
}
