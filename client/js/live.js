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
 * How long a view waits for its first "subscribed" before it reads history anyway: a
 * proxy that opens the socket and passes nothing must not leave the page blank.
 */
export const SUBSCRIBE_WAIT_MS = 4000;

/**
 * connect({run: id}, msg => ..., {onOpen(reconnected)}) -> {close(), subscribed}.
 * onOpen is called at each connection's "subscribed" message (reconnected: not the first).
 * Without `run` the socket carries run summaries ({"type": "run"}) for the runs list.
 *
 * `subscribed` resolves when the server's first "subscribed" message arrives: from
 * then on whatever a trainer sends reaches this socket, so history read after it
 * misses nothing (read before it, a record or a status change in between would be in
 * neither). It also resolves, so that history is read anyway, when the first attempt
 * closes before subscribing (no live server, a proxy without websockets) or after
 * SUBSCRIBE_WAIT_MS.
 */
export function connect(query, onMessage, { onOpen } = {}) {
  let socket = null;
  let closed = false;
  let delay = 500;
  let timer = 0;
  let opens = 0;
  let isOpen = false;
  let settle = null;
  const subscribed = new Promise((resolve) => {
    const wait = setTimeout(() => settle && settle(), SUBSCRIBE_WAIT_MS);
    settle = () => {
      clearTimeout(wait);
      settle = null;
      resolve();
    };
  });

  const open = () => {
    socket = new WebSocket(wsUrl("/ws/live", query), wsProtocols());
    socket.addEventListener("open", () => {
      isOpen = true;
      openSockets += 1;
      showConnection();
      delay = 500;
      opens += 1;
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
      if (msg && typeof msg === "object") {
        if (msg.type === "subscribed") {
          if (settle) settle();
          // a reconnection's caller refetches history now, not at "open": read before
          // the subscription, history could miss what comes in between (above)
          if (onOpen) onOpen(opens > 1);
        }
        onMessage(msg);
      }
    });
    socket.addEventListener("close", () => {
      if (isOpen) {
        openSockets -= 1;
        isOpen = false;
      }
      showConnection();
      if (settle) settle(); // no subscription this time: read history without it
      if (closed) return;
      timer = setTimeout(open, delay);
      delay = Math.min(delay * 2, 10000);
    });
  };
  open();
  return {
    subscribed,
    close() {
      closed = true;
      if (settle) settle();
      clearTimeout(timer);
      if (socket) socket.close(1000, "view closed");
    },
  };
}
