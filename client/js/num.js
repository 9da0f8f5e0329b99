// Numbers from the wire. JSON has no NaN or infinity, so the protocol sends them as
// the strings "NaN", "Infinity", "-Infinity" (docs/PROTOCOL.md); map them back here
// and nowhere else.

const NONFINITE = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };

/** A protocol number as a JS number; null/undefined stay null. */
export function num(value) {
  if (typeof value === "number") return value;
  if (value === null || value === undefined) return null;
  if (typeof value === "string" && value in NONFINITE) return NONFINITE[value];
  const n = Number(value);
  return Number.isNaN(n) ? NaN : n;
}

/** True when the value is present but NaN or ±Infinity. */
export function isNonFinite(value) {
  const n = num(value);
  return n !== null && !Number.isFinite(n);
}

/**
 * A per-timestep series as an array of numbers, or null when it is neither form the
 * protocol allows: a list of numbers, or {"f64": base64 of little-endian float64}
 * (packed by the trainer; either base64 alphabet). Decoded here, once per record.
 */
export function seriesValues(value) {
  if (Array.isArray(value)) return value;
  if (!value || typeof value.f64 !== "string") return null;
  let bin;
  try {
    bin = atob(value.f64.replace(/-/g, "+").replace(/_/g, "/"));
  } catch {
    return null;
  }
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i += 1) bytes[i] = bin.charCodeAt(i);
  const view = new DataView(bytes.buffer);
  const out = new Array(bytes.length >> 3);
  for (let i = 0; i < out.length; i += 1) out[i] = view.getFloat64(i * 8, true);
  return out;
}

// The heatmap's fixed colour scale: norms span about 1e-30 (no gradient left) to 1e3
// (exploding). A fixed scale keeps colours comparable between runs and over time.
export const LOG_MIN = -30;
export const LOG_MAX = 3;

/** log10 of a norm, clamped to the heatmap scale; 0 maps to the floor, NaN to a gap. */
export function logNorm(value) {
  const n = num(value);
  if (n === null || Number.isNaN(n)) return null;
  if (n <= 0) return LOG_MIN;
  if (n === Infinity) return LOG_MAX;
  return Math.min(LOG_MAX, Math.max(LOG_MIN, Math.log10(n)));
}

/** Short human text for a number: 1.23e-7, 0.0421, 12.5, 3,400. */
export function fmt(value) {
  const n = num(value);
  if (n === null) return "–";
  if (Number.isNaN(n)) return "NaN";
  if (!Number.isFinite(n)) return n > 0 ? "∞" : "−∞";
  if (n === 0) return "0";
  const a = Math.abs(n);
  if (a >= 1e6 || a < 1e-3) return n.toExponential(2);
  if (Number.isInteger(n)) return n.toLocaleString("en-US");
  return n.toPrecision(3);
}

export function fmtBytes(value) {
  const n = num(value);
  if (n === null || !Number.isFinite(n)) return fmt(value);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

export function fmtSeconds(value) {
  const n = num(value);
  if (n === null || !Number.isFinite(n)) return fmt(value);
  if (n < 1e-3) return `${(n * 1e6).toFixed(0)} µs`;
  if (n < 1) return `${(n * 1e3).toFixed(1)} ms`;
  if (n < 120) return `${n.toFixed(2)} s`;
  return `${(n / 60).toFixed(1)} min`;
}

export function fmtAgo(unixSeconds) {
  const t = num(unixSeconds);
  if (t === null || !Number.isFinite(t)) return "–";
  const s = Math.max(0, Date.now() / 1000 - t);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return new Date(t * 1000).toISOString().slice(0, 16).replace("T", " ");
}

/** A span of seconds: "45 s", "12 min", "3.5 h", "2.1 d". */
export function fmtDuration(seconds) {
  const s = num(seconds);
  if (s === null || !Number.isFinite(s) || s < 0) return "–";
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

/** A unix time as local "YYYY-MM-DD HH:MM" (when a run started). */
export function fmtTime(unixSeconds) {
  const t = num(unixSeconds);
  if (t === null || !Number.isFinite(t)) return "–";
  const d = new Date(t * 1000);
  const two = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())} ${two(d.getHours())}:${two(d.getMinutes())}`;
}
