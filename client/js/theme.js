// Light and dark: follow prefers-color-scheme until the user picks one with the toggle.

import { retheme } from "./charts.js";

const KEY = "gradwatch-theme";
const dark = window.matchMedia("(prefers-color-scheme: dark)");

export function currentTheme() {
  return document.documentElement.dataset.theme || (dark.matches ? "dark" : "light");
}

export function initTheme(button) {
  let saved = null;
  try {
    saved = window.localStorage.getItem(KEY);
  } catch {
    // Storage can be off (private mode, file:// reports): the system theme it is.
  }
  if (saved === "light" || saved === "dark") document.documentElement.dataset.theme = saved;
  button.addEventListener("click", () => {
    const next = currentTheme() === "dark" ? "light" : "dark";
    document.documentElement.dataset.theme = next;
    try {
      window.localStorage.setItem(KEY, next);
    } catch {
      // Not remembered; still switched.
    }
    retheme();
  });
  dark.addEventListener("change", () => retheme());
}
