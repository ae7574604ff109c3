// A subject's notification feed on its own timeline view: a bell with the unseen count and,
// behind it, the grouped list (one row per group, newest updated first) with mark read, all
// kept live from `GET .../notifications/stream`. Opening the list marks seen what it shows.
import { api, query, seg } from "./api.js";
import { openStream } from "./sse.js";
import { attempt, el, showError, when } from "./ui.js";

const PAGE = 20;
/** The most a page of the feed holds (and a feed keeps 200 groups). */
const MAX_PAGE = 250;
const SVG = "http://www.w3.org/2000/svg";

/** What each known kind says its actors did; any other kind is named as it is. */
const VERBS = {
  like: "liked",
  mention: "mentioned you",
  reply: "replied to you",
  follow: "followed you",
  repost: "reposted",
};

/**
 * Like `attempt`, but leaves the error banner alone on success: the feed reads in the
 * background, and must not clear what the rest of the view just said.
 */
async function quietly(action) {
  try {
    return await action();
  } catch (error) {
    showError(error);
    return undefined;
  }
}

/** `bob`, `bob and ann`, `bob and 2 others`: a group's actors, newest first. */
function actorsText(item) {
  const actors = item.actors || [];
  const total = Math.max(item.actor_count || 0, actors.length);
  if (!actors.length) return "Someone";
  if (total === 1) return actors[0];
  if (total === 2 && actors.length === 2) return `${actors[0]} and ${actors[1]}`;
  const others = total - 1;
  return `${actors[0]} and ${others} ${others === 1 ? "other" : "others"}`;
}

/** The row's one line: "bob and 2 others liked", "carol mentioned you", "ann: poke". */
export function summary(item) {
  const verb = VERBS[item.kind];
  return verb ? `${actorsText(item)} ${verb}` : `${actorsText(item)}: ${item.kind}`;
}

/** The newest event's `text`, when its payload has one. */
function latestText(item) {
  const payload = item.latest?.payload;
  return payload && typeof payload === "object" && typeof payload.text === "string" ? payload.text : null;
}

/** Newest updated first; `updated_at` is fixed-width RFC 3339, so it sorts as text. */
function newer(a, b) {
  if (a.updated_at !== b.updated_at) return a.updated_at > b.updated_at;
  return a.id > b.id;
}

function bellIcon() {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("width", "18");
  svg.setAttribute("height", "18");
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("focusable", "false");
  const path = document.createElementNS(SVG, "path");
  path.setAttribute("d", "M12 3a6 6 0 0 0-6 6v3.6L4.3 16h15.4L18 12.6V9a6 6 0 0 0-6-6zm-2.2 15a2.2 2.2 0 0 0 4.4 0z");
  path.setAttribute("fill", "currentColor");
  svg.append(path);
  return svg;
}

/**
 * The bell and the panel of `subject`'s feed, for the subject's own token: `{ bell, panel,
 * close() }`. The caller places both; `close` ends the stream.
 */
export function notificationFeed(subject) {
  const base = `/v1/subjects/${seg(subject)}/notifications`;
  /** id -> { item, node, paint, touched }: `touched` is the stream change that last set it. */
  const rows = new Map();
  let counts = { unseen: 0, unread: 0, version: 0 };
  let nextCursor = null;
  let loaded = false;
  /** Stream changes applied so far: a page read since may not undo a later one. */
  let changes = 0;
  let countsChangedAt = 0;
  /** id -> the change that removed it, so a page read from before does not bring it back. */
  const removedAt = new Map();
  /** Whether the next `marker` (the first of a connection) calls for a fresh page. */
  let needsPage = true;
  let stream = null;

  const count = el("span", { id: "bell-count", class: "bell-count", hidden: true }, "0");
  const bell = el(
    "button",
    {
      type: "button",
      id: "bell",
      class: "secondary bell",
      "aria-expanded": "false",
      "aria-controls": "notifications",
      "aria-label": "Notifications",
      onclick: () => toggle(),
    },
    bellIcon(),
    el("span", { class: "bell-text" }, "Notifications"),
    count,
  );
  const unreadText = el("span", { id: "notifications-unread" }, "Unread: 0");
  const readAll = el(
    "button",
    { type: "button", id: "notifications-read-all", class: "secondary", disabled: true, onclick: () => markAllRead() },
    "Mark all read",
  );
  const state = el("span", { id: "notifications-state", class: "status" }, "connecting");
  const list = el("ul", {
    id: "notification-list",
    class: "entries notifications",
    "aria-label": "Notifications, newest first",
    tabindex: "-1",
  });
  const none = el("p", { id: "notifications-empty", class: "status empty", hidden: true },
    "No notifications yet: likes, mentions and other events addressed to you appear here as they happen.");
  const older = el(
    "button",
    { type: "button", id: "notifications-older", class: "secondary", hidden: true, onclick: () => loadOlder() },
    "Older notifications",
  );
  const panel = el(
    "section",
    { id: "notifications", class: "notification-panel", "aria-labelledby": "notifications-heading", hidden: true },
    el("h3", { id: "notifications-heading" }, "Notifications"),
    el("p", {}, unreadText, " ", readAll, " ", state),
    list,
    none,
    older,
  );

  function paintCounts() {
    const unseen = counts.unseen;
    count.textContent = String(unseen);
    count.hidden = unseen === 0;
    bell.dataset.unseen = String(unseen);
    bell.setAttribute("aria-label", unseen ? `Notifications, ${unseen} unseen` : "Notifications, none unseen");
    bell.classList.toggle("has-unseen", unseen > 0);
    unreadText.textContent = `Unread: ${counts.unread}`;
    readAll.disabled = counts.unread === 0;
    none.hidden = !loaded || rows.size > 0;
  }

  function setCounts(value) {
    counts = { unseen: value.unseen, unread: value.unread, version: Math.max(counts.version, value.version ?? 0) };
    paintCounts();
  }

  /**
   * Writes the marker (`body`) and, when the stream changed nothing meanwhile, shows the
   * answer with `mark(row)` applied to each row; otherwise reads the page again, since what
   * the write covered is no longer what is shown. True once written.
   */
  async function writeMarker(body, mark) {
    const from = changes;
    const answer = await attempt(() => api("PUT", `${base}/marker`, body));
    if (!answer) return false;
    if (changes > from) {
      // The stream's own `marker` for this write may have come first: its counts are as new.
      if (!(countsChangedAt > from && counts.version >= answer.version)) setCounts(answer);
      await refresh();
      return true;
    }
    for (const row of rows.values()) {
      const item = mark(row.item);
      if (item !== row.item) {
        row.item = item;
        row.paint();
      }
    }
    setCounts(answer);
    return true;
  }

  /** One group's row; `paint` shows its item as it is now. */
  function rowNode(item) {
    const line = el("strong", { class: "summary" });
    const mark = el("span", { class: "unread-mark" }, "unread");
    const text = el("p", { class: "payload" });
    const meta = el("div", { class: "meta" });
    const readOne = el("button", { type: "button", class: "secondary mark-one", onclick: () => markRead(row) }, "Mark read");
    const node = el("li", { dataset: { id: item.id } },
      el("div", { class: "notice-line" }, line, " ", mark),
      text,
      meta,
      el("div", { class: "actions" }, readOne));
    const row = { item, node, touched: 0, paint };
    function paint() {
      const current = row.item;
      const said = summary(current);
      line.textContent = said;
      const shown = latestText(current);
      text.textContent = shown ?? "";
      text.hidden = shown === null;
      meta.replaceChildren(
        el("time", { datetime: current.updated_at }, when(current.updated_at)),
        ` · ${current.count} ${current.count === 1 ? "event" : "events"}`,
      );
      if (current.group) meta.append(` · ${current.group}`);
      node.dataset.count = String(current.count);
      node.dataset.kind = current.kind;
      node.dataset.seen = String(current.seen);
      node.classList.toggle("unread", !current.read);
      mark.hidden = current.read;
      readOne.hidden = current.read;
      readOne.setAttribute("aria-label", `Mark read: ${said}`);
    }
    paint();
    return row;
  }

  /** Puts the row where its `updated_at` places it, newest first. */
  function place(row) {
    const after = [...list.children].find((node) => node !== row.node && newer(row.item, rows.get(node.dataset.id).item));
    if (after) {
      if (row.node.nextSibling !== after) list.insertBefore(row.node, after);
    } else if (list.lastChild !== row.node) {
      list.append(row.node);
    }
  }

  /** Shows `item` in its group's row (a new row for a new group), in its place. */
  function put(item, touched) {
    let row = rows.get(item.id);
    if (row) {
      row.item = item;
      row.paint();
    } else {
      row = rowNode(item);
      rows.set(item.id, row);
    }
    if (touched !== undefined) row.touched = touched;
    place(row);
  }

  function remove(id) {
    const row = rows.get(id);
    if (!row) return;
    row.node.remove();
    rows.delete(id);
  }

  /**
   * Reads the first page again, as deep as the list shows, and shows it: the list after is
   * the page, less what the stream changed while it was read.
   */
  async function refresh() {
    const from = changes;
    const limit = Math.min(MAX_PAGE, Math.max(PAGE, rows.size));
    const page = await quietly(() => api("GET", `${base}${query({ limit })}`));
    if (!page) return;
    const ids = new Set(page.items.map((item) => item.id));
    for (const [id, row] of [...rows]) {
      if (!ids.has(id) && row.touched <= from) remove(id);
    }
    apply(page, from);
    nextCursor = page.next_cursor;
    older.hidden = !nextCursor;
  }

  async function loadOlder() {
    if (!nextCursor) return;
    const from = changes;
    const page = await attempt(() => api("GET", `${base}${query({ limit: PAGE, cursor: nextCursor })}`));
    if (!page) return;
    apply(page, from);
    nextCursor = page.next_cursor;
    older.hidden = !nextCursor;
  }

  /** Shows a page read when the stream had made `from` changes. */
  function apply(page, from) {
    for (const item of page.items) {
      if ((removedAt.get(item.id) ?? -1) > from) continue;
      const row = rows.get(item.id);
      if (row && row.touched > from) continue;
      put(item);
    }
    loaded = true;
    if (countsChangedAt <= from) setCounts({ unseen: page.unseen, unread: page.unread, version: page.marker.version });
    else paintCounts();
  }

  /** Marks what the list shows as seen: up to its newest row. */
  async function markSeen() {
    const newest = list.firstElementChild;
    if (!newest || counts.unseen === 0) return;
    const until = rows.get(newest.dataset.id).item.updated_at;
    await writeMarker({ seen_until: until }, (item) =>
      item.updated_at <= until && !item.seen ? { ...item, seen: true } : item);
  }

  async function markRead(row) {
    const id = row.item.id;
    const hadFocus = row.node.contains(document.activeElement);
    const done = await writeMarker({ read: [id] }, (item) => (item.id === id ? { ...item, read: true } : item));
    // Its button is gone now: keep the focus in the list rather than lose it to the page.
    if (done && hadFocus) list.focus();
  }

  async function markAllRead() {
    await writeMarker({ read: "all", seen: true }, (item) =>
      item.read && item.seen ? item : { ...item, read: true, seen: true });
  }

  function toggle() {
    const open = panel.hidden;
    panel.hidden = !open;
    bell.setAttribute("aria-expanded", String(open));
    if (open) markSeen();
  }

  function onEvent(type, value) {
    if (type === "group") {
      changes += 1;
      removedAt.delete(value.id);
      // A resumed stream may send again a change from before what is shown.
      const shown = rows.get(value.id);
      if (!shown || value.updated_at >= shown.item.updated_at) put(value, changes);
      paintCounts();
    } else if (type === "removed") {
      changes += 1;
      removedAt.set(value.id, changes);
      remove(value.id);
      paintCounts();
    } else if (type === "marker") {
      changes += 1;
      countsChangedAt = changes;
      // The marker moved elsewhere (another tab, device or client): rows' seen and read are
      // as a page says them now.
      const moved = value.version > counts.version;
      setCounts(value);
      if (needsPage || moved) {
        needsPage = false;
        refresh();
      }
    } else if (type === "lagged") {
      refresh();
    } else if (type === "error") {
      showError({ message: `${value.error.code}: ${value.error.message}` });
    }
  }

  stream = openStream(`${base}/stream`, {
    onEvent,
    onError: (error) => showError(error),
    onState: (text) => {
      state.textContent = text;
      bell.dataset.stream = text;
      // A connection that resumes without an id starts now: read a page when it is back.
      if (text === "reconnecting") needsPage = true;
      if (text === "stopped" && !loaded) refresh();
    },
  });
  paintCounts();

  return {
    bell,
    panel,
    close() {
      stream?.close();
    },
  };
}
