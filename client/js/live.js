// The live websocket (/ws/live): one connect() per view, dispatching on msg.type in
// the caller; reconnects with backoff and tells the caller, which refetches history
// for whatever it missed while the socket was down.

import { wsProtocols, wsUrl } from "./api.js";
import { stats } from "./state.js";

let openSockets = 0;
let serverUp = null; // a view without a socket (replay) says whether the server answers

function showConnection() {
  const node = document.getElementById("conn");
  if (!node) return;
  const on = openSockets > 0 || serverUp === true;
  node.textContent = openSockets > 0 ? "live" : serverUp === true ? "server up" : "offline";
  node.className = `conn ${on ? "on" : "off"}`;
}

/** Say whether the server answers (up), for views with no live socket; null: sockets decide. */
export function setServerUp(up) {
  serverUp = up;
  showConnection();
}

/**
 * connect({run: id}, msg => ..., {onOpen(reconnected)}) -> {close()}.
 * Without `run` the socket carries run summaries ({"type": "run"}) for the runs list.
 */
export function connect(query, onMessage, { onOpen } = {}) {
  let socket = null;
  let closed = false;
  let delay = 500;
  let timer = 0;
  let opens = 0;
  let isOpen = false;

  const open = () => {
    socket = new WebSocket(wsUrl("/ws/live", query), wsProtocols());
    socket.addEventListener("open", () => {
      isOpen = true;
      openSockets += 1;
      showConnection();
      delay = 500;
      opens += 1;
      if (onOpen) onOpen(opens > 1);
    });
    socket.addEventListener("message", (event) => {
      stats.messages += 1;
      let msg;
      try {
        msg = JSON.parse(event.data);
      } catch {
        console.warn("gradwatch: ignored a live message that is not JSON");
        return;
      }
      if (msg && typeof msg === "object") onMessage(msg);
    });
    socket.addEventListener("close", () => {
      if (isOpen) {
        openSockets -= 1;
        isOpen = false;
      }
      showConnection();
      if (closed) return;
      timer = setTimeout(open, delay);
      delay = Math.min(delay * 2, 10000);
    });
  };
  open();
  return {
    close() {
      closed = true;
      clearTimeout(timer);
      if (socket) socket.close(1000, "view closed");
    },
  };
}
