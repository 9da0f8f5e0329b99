// The heatmap's colour scales. "relative" (the default): each row (one training step)
// against its own peak, in decades below it, so where the gradient dies shows at a
// glance whatever the norms' magnitude. "absolute": log10 of the norm, on a range that
// fits the data (the report keeps the fixed 1e-30 … 1e3 scale). Pure functions.

import { LOG_MAX, LOG_MIN, logNorm, num } from "./num.js";
import { HORIZON_FACTOR } from "./profile.js";

export const SCALES = { relative: "decades below each step's peak", absolute: "log10 of the norm" };
// The decade the vanishing horizon sits at, relative to a row's peak (1e-3).
export const HORIZON_DECADES = Math.log10(HORIZON_FACTOR);
// A relative scale spans at least this many decades below the peak (the horizon shows).
const MIN_DECADES = 6;

/** The largest finite positive value of a row, or null. */
function peak(values) {
  let top = 0;
  for (const v of values) {
    const n = num(v);
    if (n !== null && Number.isFinite(n) && n > top) top = n;
  }
  return top > 0 ? top : null;
}

/** One row's colour values: relative → log10(v / peak) (≤ 0), absolute → logNorm(v). */
export function scaleRow(values, scale) {
  if (scale !== "relative") return values.map(logNorm);
  const top = peak(values);
  return values.map((v) => {
    const n = num(v);
    if (n === null || Number.isNaN(n)) return null;
    if (n === Infinity) return 0;
    if (top === null || n <= 0) return LOG_MIN;
    return Math.max(LOG_MIN, Math.log10(n / top));
  });
}

/** Earliest timestep within the horizon factor of the row's peak (as profile.horizon). */
export function rowHorizon(values) {
  const top = peak(values);
  if (top === null) return null;
  for (let t = 0; t < values.length; t += 1) {
    const n = num(values[t]);
    if (n !== null && Number.isFinite(n) && n >= top * HORIZON_FACTOR) return t;
  }
  return null;
}

/**
 * The colour range [zmin, zmax] that fits scaled rows: whole decades, the floor
 * (no gradient at all) left out so one zero does not stretch the scale to 1e-30.
 */
export function fitRange(rows, scale) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const row of rows) {
    for (const z of row) {
      if (z === null || z <= LOG_MIN) continue;
      if (z < lo) lo = z;
      if (z > hi) hi = z;
    }
  }
  if (scale === "relative") {
    const bottom = lo === Infinity ? -MIN_DECADES : Math.min(-MIN_DECADES, Math.floor(lo));
    return [Math.max(LOG_MIN, bottom), 0];
  }
  if (lo === Infinity) return [LOG_MIN, LOG_MAX];
  const zmin = Math.floor(lo);
  return [zmin, Math.max(zmin + 1, Math.ceil(hi))];
}

/** Colour-bar ticks for a range: about six, at whole decades. */
export function scaleTicks([zmin, zmax], scale) {
  const span = zmax - zmin;
  const stepBy = [1, 2, 3, 5, 10].find((s) => span / s <= 6) || 10;
  const vals = [];
  for (let t = zmax; t >= zmin; t -= stepBy) vals.push(t);
  const text = vals.map((t) => {
    if (scale === "relative") return t === 0 ? "peak" : `1e${t}`;
    return t === 0 ? "1" : `1e${t}`;
  });
  return { tickvals: vals, ticktext: text };
}
