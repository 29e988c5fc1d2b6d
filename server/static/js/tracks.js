// Track colours: every instrument of a file (pretty_midi's numbering, midi.js's `instruments`: one per track,
// program and channel) gets a colour slot, and every note its instrument's. The upload's instruments take the
// slots in their order; an answer's instrument takes the slot of the upload's with the same name, program and
// drums (the n-th such to the n-th), so a track keeps its colour from the upload to the result. One the upload
// did not have (an "accompaniment") takes a slot of its own, unless it is the upload's only instrument on its
// program: a merged stream continued on the motif's instrument sounds as that instrument. The colours are
// style.css's --track-N (Okabe-Ito, one set for each theme).

export const TRACK_COLOURS = 8; // --track-0 ... --track-7

const base = (inst) => `${inst.drum ? "drums" : inst.program}|${inst.name || ""}`;

// Each instrument's key: its name, program and drums, and which of the file's instruments with those it is.
export function instrumentKeys(parsed) {
  const seen = new Map();
  return parsed.instruments.map((inst) => {
    const b = base(inst), k = seen.get(b) || 0;
    seen.set(b, k + 1);
    return `${b}#${k}`;
  });
}

export class TrackColours {
  constructor() {
    this.slots = new Map(); // key -> {slot, name, program, drum, track, upload}
  }

  // A new upload: its instruments take the first slots, in their order.
  reset(parsed) {
    this.slots.clear();
    if (parsed) this.paint(parsed, true);
  }

  // Every note of a parsed file gets its instrument's slot (n.slot) and key (n.key). The upload's instruments
  // this file has by name are its own, not another's to share (a melody kept beside its accompaniment).
  paint(parsed, upload = false) {
    const keys = instrumentKeys(parsed);
    const taken = new Set(keys.filter((k) => this.slots.has(k)).map((k) => this.slots.get(k).slot));
    const slotOf = parsed.instruments.map((inst, i) => this.slotFor(keys[i], inst, upload, taken));
    for (const n of parsed.notes) {
      n.key = keys[n.instrument];
      n.slot = slotOf[n.instrument];
    }
    return parsed;
  }

  // A note that knows its program only (a streamed one): the upload's instrument on that program when it
  // has only one, else a slot for the program.
  slotOfProgram(program, drum = false) {
    return this.slotFor(`${drum ? "drums" : program}|#stream`, { program, drum, name: "", track: null }, false);
  }

  slotFor(key, inst, upload, taken = new Set()) {
    const known = this.slots.get(key);
    if (known) return known.slot;
    if (!upload) {
      const same = [...this.slots.values()].filter((s) => s.upload && !taken.has(s.slot) &&
        s.drum === !!inst.drum && (inst.drum || s.program === inst.program));
      if (same.length === 1) return same[0].slot;
    }
    const slot = this.slots.size;
    this.slots.set(key, { slot, name: inst.name || "", program: inst.program, drum: !!inst.drum, track: inst.track,
      upload });
    return slot;
  }

  // The instruments a set of notes has, by slot, for the legend: [{slot, name, program, drum, track}].
  present(notes) {
    const used = new Set(notes.map((n) => n.slot));
    return [...this.slots.values()].filter((s) => used.has(s.slot));
  }
}
