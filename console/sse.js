// Server-sent events read with fetch, since EventSource cannot send a bearer header:
// `event:`, `id:` and `data:` lines, resumed with `Last-Event-ID` after a drop.
import { authHeaders, errorOf } from "./api.js";

/**
 * Opens `path` and calls `onEvent(type, value, id)` per event with its data parsed (every
 * stream of the API sends JSON; an event whose data is not JSON is passed over),
 * `onError(error)` when the server refuses (a 4xx other than 429 stops for good; anything
 * else is retried), and `onState(text)` as the connection comes and goes. Returns
 * `{ close() }`.
 */
export function openStream(path, { onEvent, onError = () => {}, onState = () => {} }) {
  const controller = new AbortController();
  let lastId = null;
  let closed = false;
  let delay = 500;

  async function run() {
    while (!closed) {
      try {
        const headers = authHeaders({ Accept: "text/event-stream" });
        if (lastId) headers["Last-Event-ID"] = lastId;
        const response = await fetch(path, { headers, signal: controller.signal });
        if (!response.ok) {
          const error = await errorOf(response);
          onError(error);
          if (response.status < 500 && response.status !== 429) {
            onState("stopped");
            return;
          }
        } else {
          onState("live");
          delay = 500;
          await read(response.body);
        }
      } catch (error) {
        if (closed) return;
        onError(error);
      }
      if (closed) return;
      onState("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 10000);
    }
  }

  async function read(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let type = "";
    let data = [];
    let id = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      const lines = buffer.split(/\r\n|\r|\n/);
      buffer = lines.pop();
      for (const line of lines) {
        if (line === "") {
          if (id !== null) lastId = id;
          if (data.length) dispatch(type || "message", data.join("\n"), id);
          type = "";
          data = [];
          id = null;
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") type = value;
        else if (field === "data") data.push(value);
        else if (field === "id") id = value;
      }
    }
  }

  function dispatch(type, data, id) {
    let value;
    try {
      value = JSON.parse(data);
    } catch {
      return;
    }
    onEvent(type, value, id);
  }

  run();
  return {
    close() {
      closed = true;
      controller.abort();
    },
  };
}
