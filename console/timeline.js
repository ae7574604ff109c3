// The home timeline (live, with paging and the read marker, posting, follow and unfollow)
// and a subject's page (its events with their fan-out status, followers and following).
import { api, query, seg } from "./api.js";
import { openStream } from "./sse.js";
import { attempt, el, field, payloadText, showError, when } from "./ui.js";

const PAGE = 20;

/** A form for admins to pick the subject a view shows. */
function subjectPicker(view, subject, label) {
  const input = el("input", { id: `${view}-subject`, name: "subject", value: subject, required: true });
  return el(
    "form",
    {
      id: `${view}-pick`,
      onsubmit: (event) => {
        event.preventDefault();
        location.hash = `view=${view}&subject=${encodeURIComponent(input.value.trim())}`;
      },
    },
    field(label, input),
    el("button", { type: "submit" }, "Show"),
  );
}

export function timelineView(root, { who, params, setFragment }) {
  const subject = who.kind === "admin" ? params.get("subject") || "" : who.name;
  setFragment({ view: "timeline", subject: who.kind === "admin" ? subject : undefined });
  root.append(el("h2", {}, subject ? `Timeline of ${subject}` : "Timeline"));
  if (who.kind === "admin") root.append(subjectPicker("timeline", subject, "Subject whose timeline to show"));
  if (!subject) return { close() {} };

  const base = `/v1/subjects/${seg(subject)}`;
  const entries = new Map();
  let marker = { last_read: null, version: 0, unread: 0 };
  let nextCursor = null;
  let stream = null;

  const payload = el("textarea", { id: "post-payload", name: "payload", required: true });
  const asJson = el("input", { id: "post-json", name: "json", type: "checkbox" });
  const postForm = el(
    "form",
    { id: "post-form", onsubmit: (event) => { event.preventDefault(); post(); } },
    field(`Post as ${subject}`, payload),
    field("JSON payload", asJson),
    el("button", { type: "submit", id: "post" }, "Post"),
  );
  const target = el("input", { id: "follow-target", name: "target", required: true });
  const followForm = el(
    "form",
    { id: "follow-form", onsubmit: (event) => { event.preventDefault(); follow("PUT"); } },
    field("Subject to follow or unfollow", target),
    el("button", { type: "submit", id: "follow" }, "Follow"),
    el("button", { type: "button", id: "unfollow", class: "secondary", onclick: () => follow("DELETE") }, "Unfollow"),
  );
  const markerText = el("span", { id: "marker" });
  const markRead = el("button", { type: "button", id: "mark-read", class: "secondary", onclick: () => markAllRead() }, "Mark all read");
  const state = el("span", { id: "stream-state", class: "status" }, "connecting");
  const list = el("ul", { id: "entries", class: "entries", "aria-label": "Timeline entries" });
  const older = el("button", { type: "button", id: "older", class: "secondary", hidden: true, onclick: () => loadPage(nextCursor) }, "Older entries");
  root.append(
    postForm,
    followForm,
    el("p", {}, markerText, " ", markRead, " ", state),
    list,
    older,
  );

  function entryNode(item) {
    return el(
      "li",
      { dataset: { rowKey: item.row_key, eventId: item.event_id, author: item.author } },
      el(
        "div",
        { class: "meta" },
        el("a", { href: `#view=subject&subject=${encodeURIComponent(item.author)}` }, item.author),
        ` · ${item.kind} · `,
        el("time", { datetime: item.at }, when(item.at)),
      ),
      el("pre", { class: "payload" }, payloadText(item.payload)),
    );
  }

  /** Places an entry by its row key (ascending row keys are newest first), once. */
  function add(item) {
    if (entries.has(item.row_key)) return;
    const node = entryNode(item);
    entries.set(item.row_key, node);
    const after = [...list.querySelectorAll("li[data-row-key]")].find((li) => li.dataset.rowKey > item.row_key);
    list.insertBefore(node, after || null);
  }

  function drop(predicate) {
    for (const [key, node] of entries) {
      if (predicate(node)) {
        node.remove();
        entries.delete(key);
      }
    }
    paintMarker();
  }

  function paintMarker() {
    markerText.textContent = `Unread: ${marker.unread}`;
    list.querySelector(".marker-line")?.remove();
    let first = null;
    for (const node of list.querySelectorAll("li[data-row-key]")) {
      const read = marker.last_read !== null && node.dataset.rowKey >= marker.last_read;
      node.classList.toggle("read", read);
      if (read && !first) first = node;
    }
    if (first) list.insertBefore(el("li", { class: "marker-line" }, "read up to here"), first);
  }

  async function loadPage(cursor) {
    const page = await attempt(() => api("GET", `${base}/timeline${query({ limit: PAGE, cursor })}`));
    if (!page) return;
    page.items.forEach(add);
    nextCursor = page.next_cursor;
    older.hidden = !nextCursor;
    paintMarker();
    return page;
  }

  async function loadMarker() {
    const answer = await attempt(() => api("GET", `${base}/marker`));
    if (answer) marker = answer;
    paintMarker();
  }

  async function markAllRead() {
    const newest = list.querySelector("li[data-row-key]");
    if (!newest) return;
    const answer = await attempt(() => api("PUT", `${base}/marker`, { last_read: newest.dataset.rowKey, version: marker.version }));
    if (answer) {
      marker = answer;
      paintMarker();
    } else {
      const error = document.getElementById("error").textContent;
      await loadMarker();
      showError({ message: error });
    }
  }

  async function post() {
    let body;
    if (asJson.checked) {
      try {
        body = JSON.parse(payload.value);
      } catch (error) {
        showError({ message: `not JSON: ${error.message}` });
        return;
      }
    } else {
      body = { text: payload.value };
    }
    const answer = await attempt(() => api("POST", `${base}/events`, { kind: "post", payload: body }));
    if (answer) payload.value = "";
  }

  async function follow(method) {
    const name = target.value.trim();
    if (!name) return;
    const done = await attempt(async () => {
      await api(method, `${base}/following/${seg(name)}`);
      return true;
    });
    if (done && method === "PUT") {
      // A follow's backfill is not streamed: read the first page again (its job may still run).
      await loadPage(null);
    }
  }

  function onEvent(type, data) {
    let value;
    try {
      value = JSON.parse(data);
    } catch {
      return;
    }
    if (type === "entry") {
      // A new entry newer than the marker is one more unread.
      const unread = !entries.has(value.row_key) && (marker.last_read === null || value.row_key < marker.last_read);
      add(value);
      if (unread) marker.unread += 1;
      paintMarker();
    } else if (type === "removed") {
      drop((node) => node.dataset.eventId === value.event_id);
      loadMarker();
    } else if (type === "unfollowed") {
      drop((node) => node.dataset.author === value.author);
      loadMarker();
    } else if (type === "marker") {
      marker = value;
      paintMarker();
    } else if (type === "lagged") {
      loadPage(null);
      loadMarker();
    } else if (type === "error") {
      showError({ message: `${value.error.code}: ${value.error.message}` });
    }
  }

  (async () => {
    const page = await loadPage(null);
    await loadMarker();
    if (!page) {
      state.textContent = "stopped";
      return;
    }
    // Start right after what the page showed, so nothing lands unseen in between.
    const after = page.items.length ? page.items[0].row_key : new Date(Date.now() - 60000).toISOString();
    stream = openStream(`${base}/timeline/stream${query({ after })}`, {
      onEvent,
      onError: (error) => showError(error),
      onState: (text) => {
        state.textContent = text;
        root.dataset.stream = text;
      },
    });
  })();

  return {
    close() {
      stream?.close();
    },
  };
}

export function subjectView(root, { who, params, setFragment }) {
  const subject = params.get("subject") || (who.kind === "subject" ? who.name : "");
  setFragment({ view: "subject", subject });
  root.append(el("h2", {}, subject ? `Subject ${subject}` : "Subject"));
  root.append(subjectPicker("subject", subject, "Subject to show"));
  if (!subject) return { close() {} };
  const base = `/v1/subjects/${seg(subject)}`;
  const own = who.kind === "admin" || who.name === subject;

  if (who.kind === "subject" && who.name !== subject) {
    root.append(
      el("p", {}, el("button", { type: "button", id: "follow-subject", onclick: () => attempt(() => api("PUT", `/v1/subjects/${seg(who.name)}/following/${seg(subject)}`)) }, `Follow ${subject}`)),
    );
  }

  const events = el("ul", { id: "events", class: "entries", "aria-label": "Events" });
  const followers = el("ul", { id: "followers", "aria-label": "Followers" });
  const following = el("ul", { id: "following", "aria-label": "Following" });
  const moreEvents = el("button", { type: "button", class: "secondary", hidden: true }, "Older events");
  root.append(
    el("div", { class: "columns" },
      el("section", {}, el("h3", {}, "Events"), events, moreEvents),
      el("section", {}, el("h3", {}, "Followers"), followers, el("h3", {}, "Following"), following),
    ),
  );

  function eventNode(item) {
    const status = el("span", { class: "status" });
    const check = el("button", {
      type: "button",
      class: "secondary",
      onclick: async () => {
        const answer = await attempt(() => api("GET", `${base}/events/${seg(item.event_id)}/fanout`));
        if (answer) {
          status.textContent = ` ${answer.operation}: ${answer.state}, delivered ${answer.delivered}` +
            (answer.lag_ms !== undefined && answer.lag_ms !== null ? `, lag ${answer.lag_ms} ms` : "") +
            (answer.last_error ? `, last error: ${answer.last_error}` : "");
        }
      },
    }, "Fan-out status");
    return el("li", { dataset: { eventId: item.event_id } },
      el("div", { class: "meta" }, `${item.kind} · `, el("time", { datetime: item.at }, when(item.at))),
      el("pre", { class: "payload" }, payloadText(item.payload)),
      own ? el("div", {}, check, status) : null,
    );
  }

  let cursor = null;
  async function loadEvents() {
    const page = await attempt(() => api("GET", `${base}/events${query({ limit: PAGE, cursor })}`));
    if (!page) return;
    page.items.forEach((item) => events.append(eventNode(item)));
    cursor = page.next_cursor;
    moreEvents.hidden = !cursor;
  }
  moreEvents.addEventListener("click", loadEvents);

  async function loadEdges(kind, list) {
    const page = await attempt(() => api("GET", `${base}/${kind}${query({ limit: 100 })}`));
    if (!page) return;
    list.replaceChildren(...page.items.map((item) => {
      const link = el("a", { href: `#view=subject&subject=${encodeURIComponent(item.subject)}` }, item.subject);
      const unfollow = kind === "following" && own
        ? el("button", {
            type: "button",
            class: "secondary",
            "aria-label": `Unfollow ${item.subject}`,
            onclick: async () => {
              const done = await attempt(async () => { await api("DELETE", `${base}/following/${seg(item.subject)}`); return true; });
              if (done) loadEdges("following", following);
            },
          }, "Unfollow")
        : null;
      return el("li", {}, link, " ", unfollow);
    }));
    if (!page.items.length) list.append(el("li", { class: "status" }, "none"));
  }

  loadEvents();
  if (own) {
    loadEdges("followers", followers);
    loadEdges("following", following);
  } else {
    followers.append(el("li", { class: "status" }, "only the subject or the admin may see this"));
    following.append(el("li", { class: "status" }, "only the subject or the admin may see this"));
  }
  return { close() {} };
}
