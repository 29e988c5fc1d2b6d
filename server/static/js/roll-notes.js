// The notes on the piano roll: each in its track's colour (style.css's --track-N, the slot tracks.js gave its
// instrument), the answer's new notes outlined so they stand out from the kept ones whatever their track, and
// drums as diamonds on a lane of their own under the pitches (a drum's "pitch" is which drum, not a note).

import { TRACK_COLOURS } from "./tracks.js";

const DRUM_LOW = 35, DRUM_HIGH = 81; // General MIDI's percussion map: the acoustic bass drum to the open triangle

// The lane the drums take at the bottom of the plot (none without drums): [top, height] in CSS pixels.
export function drumLane(notes, top, ph) {
  if (!notes.some((n) => n.drum)) return null;
  const height = Math.round(Math.min(40, Math.max(18, ph * 0.14)));
  return { top: top + ph - height, height };
}

export const trackColour = (slot) => `--track-${(slot ?? 0) % TRACK_COLOURS}`;

// layers: [{notes, role}] ("new" notes outlined); g: the geometry roll.js drew the grid with.
export function drawNotes(ctx, layers, g, color) {
  const outline = color("--text");
  for (const layer of layers) {
    const isNew = layer.role === "new";
    for (const n of layer.notes) {
      if (n.drum && !g.lane) continue;
      ctx.globalAlpha = 0.35 + 0.65 * (n.velocity / 127);
      ctx.fillStyle = color(trackColour(n.slot));
      if (n.drum) drumMark(ctx, n, g, isNew, outline);
      else {
        const x = g.x(n.start), y = g.y(n.pitch) + 0.5;
        const w = Math.max(1.5, g.x(n.end) - x), h = Math.max(1.5, g.rowH - 1);
        ctx.fillRect(x, y, w, h);
        if (isNew) {
          // Around the note, not over it: a note one pixel high keeps its colour inside its outline.
          ctx.globalAlpha = 1;
          ctx.strokeStyle = outline;
          ctx.lineWidth = 1;
          ctx.strokeRect(Math.floor(x) - 0.5, Math.floor(y) - 0.5, Math.ceil(w) + 1, Math.ceil(h) + 1);
        }
      }
    }
  }
  ctx.globalAlpha = 1;
}

// A drum hit: a diamond at its onset (its length means nothing to a drum), higher in the lane for higher
// drums (kicks at the bottom, cymbals at the top).
function drumMark(ctx, n, g, isNew, outline) {
  const { top, height } = g.lane;
  const r = Math.max(2.5, Math.min(5, height / 5));
  const at = (Math.min(DRUM_HIGH, Math.max(DRUM_LOW, n.pitch)) - DRUM_LOW) / (DRUM_HIGH - DRUM_LOW);
  const cx = g.x(n.start), cy = top + r + 1 + (1 - at) * (height - 2 * r - 2);
  ctx.beginPath();
  ctx.moveTo(cx, cy - r);
  ctx.lineTo(cx + r, cy);
  ctx.lineTo(cx, cy + r);
  ctx.lineTo(cx - r, cy);
  ctx.closePath();
  ctx.fill();
  if (isNew) {
    ctx.globalAlpha = 1;
    ctx.strokeStyle = outline;
    ctx.lineWidth = 1;
    ctx.stroke();
  }
}

// The drum lane's own shading and label, drawn under the notes.
export function drawDrumLane(ctx, g, color) {
  if (!g.lane) return;
  ctx.fillStyle = color("--roll-grid");
  ctx.globalAlpha = 0.6;
  ctx.fillRect(g.left, g.lane.top, g.pw, g.lane.height);
  ctx.globalAlpha = 1;
  ctx.fillStyle = color("--muted");
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  ctx.fillText("drums", g.left - 4, g.lane.top + g.lane.height / 2);
}
