// Building DOM without HTML strings. Every string from the network (run, module and
// parameter names, alert text) lands in a text node: names are text, never HTML.
// And every one is shown with its invisible controls made visible (visible()).

// Characters that change how the text around them is shown instead of showing
// themselves: C0 and C1 controls (ESC, BEL, CR; tab and newline stay), DEL, the line
// and paragraph separators, and the bidirectional controls (U+202E turns the rest of
// a name around: "run\u202Egnp.exe" reads "runexe.png"). Same list as the HTML
// report's (gradwatch.protocol.names.visible).
const INVISIBLE = /[\u0000-\u0008\u000B-\u001F\u007F-\u009F\u061C\u200E\u200F\u2028-\u202E\u2066-\u2069]/g;

/**
 * A name as shown: each invisible control as a visible code, e.g.
 * visible("a\u202Eb") === "a[U+202E]b". The stored name stays as the trainer sent it.
 */
export function visible(value) {
  return String(value).replace(INVISIBLE,
    (c) => `[U+${c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0")}]`);
}

const SHOWN_ATTRIBUTES = new Set(["title", "aria-label", "placeholder", "alt"]);

/**
 * el("a", {href: "#/", class: "x", onclick: fn}, "text", child) -> Element.
 * Children that are strings or numbers become text nodes; null/false are skipped.
 */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      node.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      node.className = value;
    } else if (key === "dataset") {
      Object.assign(node.dataset, value);
    } else if (SHOWN_ATTRIBUTES.has(key)) {
      node.setAttribute(key, visible(value));  // tooltips and labels show names too
    } else {
      node.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(visible(child)));
  }
}

/** Replace all children of `node` (text stays text). */
export function replaceChildren(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

/**
 * Text for Plotly labels (titles, legend names, hover text). Plotly renders a few
 * HTML-like tags in those fields, so a run named "<b>x</b>" would turn bold, and
 * worse shapes are possible: escape the three characters that make tags (and show
 * invisible controls, as visible() does).
 */
export function plotText(value) {
  return visible(value).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

/** A stable id fragment for a name (ids only; never shown). */
export function slug(value) {
  return String(value).replace(/[^A-Za-z0-9_-]/g, (c) => `_${c.charCodeAt(0).toString(16)}`);
}
