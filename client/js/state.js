// The dashboard's one state object, and counters that tests and bench/dashboard.py read
// through window.gradwatch (they describe what was drawn; nothing reads them back).

export const state = {
  route: null, // {view: "runs"|"run"|"compare"|"replay", ids: [...]}
  runs: new Map(), // id -> run summary (GET /api/runs, live "run" messages)
  view: null, // the mounted view: {unmount()}
  connected: false,
  remounted: new Set(), // "<run>|<rank>": run views repainted for a rank that joined late
};

export const stats = {
  messages: 0, // websocket messages received
  records: 0, // live records received
  flushes: 0, // animation frames that drew pending points
  flushedItems: 0,
  extendCalls: 0, // Plotly.extendTraces calls
  paintedAt: null, // performance.now() when the current view finished its first paint
  scalarsAt: null, // ... and when the run view's scalar series (GET /steps) arrived
  ranksAt: null, // ... and when every rank's series and their spread were ready (ranks.js)
  errors: [], // messages shown to the user as errors
};

window.gradwatch = { state, stats };
