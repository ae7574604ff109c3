// The home timeline (live, with paging and the read marker, posting, follow and unfollow,
// and for a subject's own token its notification bell) and a subject's page (its events
// with their fan-out status, followers and following).
import { ApiError, api, query, seg } from "./api.js";
import { notificationFeed } from "./notifications.js";
import { openStream } from "./sse.js";
import { attempt, editedMark, el, field, payloadText, showError, when } from "./ui.js";

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
  const heading = el("h2", {}, subject ? `Timeline of ${subject}` : "Timeline");
  // The feed is the subject's own: the admin reading a timeline marks nothing seen for it.
  const feed = who.kind === "subject" && subject === who.name ? notificationFeed(subject) : null;
  root.append(feed ? el("div", { class: "heading-row" }, heading, feed.bell) : heading);
  if (feed) root.append(feed.panel);
  if (who.kind === "admin") root.append(subjectPicker("timeline", subject, "Subject whose timeline to show"));
  if (!subject) {
    root.append(el("p", { class: "status" },
      "Name a subject to read its timeline as it sees it, live, and to post, follow and edit as it. ",
      "The service's health is on the ", el("a", { href: "#view=overview" }, "overview"), "."));
    return { close() {} };
  }

  const base = `/v1/subjects/${seg(subject)}`;
  const entries = new Map();
  let marker = { last_read: null, version: 0, unread: 0 };
  let nextCursor = null;
  let stream = null;

  const TEXT_HINT = "What happened? Posted as {\"text\": …}";
  const JSON_HINT = "{\"reading\": 7}";
  const payload = el("textarea", { id: "post-payload", name: "payload", required: true, rows: 3, placeholder: TEXT_HINT });
  const asJson = el("input", {
    id: "post-json",
    name: "json",
    type: "checkbox",
    onchange: () => {
      payload.placeholder = asJson.checked ? JSON_HINT : TEXT_HINT;
      payload.classList.toggle("code", asJson.checked);
    },
  });
  const postForm = el(
    "form",
    { id: "post-form", class: "post", onsubmit: (event) => { event.preventDefault(); post(); } },
    el("label", { class: "wide" }, `Post as ${subject}`, payload),
    el("div", { class: "post-actions" },
      el("label", { class: "check" }, asJson, "The payload is JSON"),
      el("button", { type: "submit", id: "post" }, "Post")),
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
  const none = el("p", { id: "entries-empty", class: "status empty", hidden: true },
    `Nothing on ${subject}'s timeline yet: its own posts and those of the subjects it follows appear here as they are made.`);
  const older = el("button", { type: "button", id: "older", class: "secondary", hidden: true, onclick: () => loadPage(nextCursor) }, "Older entries");
  root.append(
    postForm,
    followForm,
    el("p", {}, markerText, " ", markRead, " ", state),
    list,
    none,
    older,
  );

  /** Whether the signed-in token may edit `item` (its author's own token, or the admin's). */
  function editable(item) {
    return who.kind === "admin" || (who.kind === "subject" && item.author === who.name);
  }

  /**
   * One shown entry: its item as last seen, its `li`, and its inline editor when open. The
   * node stays put as the item changes (an edit here or an `updated` event), so it keeps its
   * place in the list, and an open editor stays open.
   */
  function entryNode(item) {
    const meta = el("div", { class: "meta" });
    const shown = el("pre", { class: "payload" });
    const editButton = editable(item)
      ? el("button", { type: "button", class: "secondary edit", onclick: () => openEditor(entry) }, "Edit")
      : null;
    const node = el(
      "li",
      { dataset: { rowKey: item.row_key, eventId: item.event_id, author: item.author } },
      meta,
      shown,
      editButton ? el("div", { class: "actions" }, editButton) : null,
    );
    const entry = { item, node, editButton, editor: null, paint };
    function paint() {
      const current = entry.item;
      meta.replaceChildren(
        el("a", { href: `#view=subject&subject=${encodeURIComponent(current.author)}` }, current.author),
        ` · ${current.kind} · `,
        el("time", { datetime: current.at }, when(current.at)),
      );
      const mark = editedMark(current);
      if (mark) meta.append(" · ", mark);
      shown.textContent = payloadText(current.payload);
      node.dataset.version = String(current.version ?? 1);
    }
    paint();
    return entry;
  }

  function entryOf(eventId) {
    for (const entry of entries.values()) {
      if (entry.item.event_id === eventId) return entry;
    }
    return null;
  }

  /** Shows `item` in place of the entry of its event, unless what is shown is newer. */
  function update(item) {
    const entry = entryOf(item.event_id);
    if (!entry || (item.version ?? 1) < (entry.item.version ?? 1)) return entry;
    entry.item = { ...entry.item, ...item };
    entry.paint();
    const editor = entry.editor;
    // A save already refused as a conflict keeps the API's word and its offer to reload,
    // whichever of the refusal and this event came first.
    if (editor && !editor.saving && !editor.conflict && (item.version ?? 1) > editor.version) {
      editor.say(`Edited elsewhere since you opened this editor: it is now at version ${item.version} (shown above).`);
    }
    return entry;
  }

  /** Places an entry by its row key (ascending row keys are newest first), once. */
  function add(item) {
    if (entries.has(item.row_key)) {
      update(item);
      return;
    }
    const entry = entryNode(item);
    entries.set(item.row_key, entry);
    const after = [...list.querySelectorAll("li[data-row-key]")].find((li) => li.dataset.rowKey > item.row_key);
    list.insertBefore(entry.node, after || null);
  }

  function drop(predicate) {
    for (const [key, entry] of entries) {
      if (predicate(entry.node)) {
        entry.node.remove();
        entries.delete(key);
      }
    }
    paintMarker();
  }

  /**
   * Reads the timeline's pages again, newest first, as deep as the list shows, updating the
   * entries shown, until it meets `eventId`: true once found, false if not, undefined on an
   * error (shown).
   */
  async function reread(eventId) {
    let cursor = null;
    let seen = 0;
    for (;;) {
      const page = await attempt(() => api("GET", `${base}/timeline${query({ limit: PAGE, cursor })}`));
      if (!page) return undefined;
      page.items.forEach(update);
      if (page.items.some((item) => item.event_id === eventId)) return true;
      seen += page.items.length;
      cursor = page.next_cursor;
      if (!cursor || seen >= entries.size) return false;
    }
  }

  /** Opens the inline editor of `entry`: its payload as pretty JSON, saved at its version. */
  function openEditor(entry) {
    if (entry.editor) {
      entry.editor.text.focus();
      return;
    }
    const text = el("textarea", { name: "payload", class: "edit-payload", required: true, spellcheck: "false" });
    text.value = JSON.stringify(entry.item.payload, null, 2);
    text.rows = Math.min(12, Math.max(3, text.value.split("\n").length));
    const save = el("button", { type: "submit", class: "save" }, "Save");
    const cancel = el("button", { type: "button", class: "secondary cancel", onclick: () => closeEditor(entry) }, "Cancel");
    const note = el("span", { class: "note" });
    const reload = el(
      "button",
      { type: "button", class: "secondary reload", hidden: true, onclick: () => reloadCurrent() },
      "Reload current version",
    );
    const notice = el("div", { class: "editor-notice", role: "alert", hidden: true }, note, " ", reload);
    const form = el(
      "form",
      {
        class: "editor",
        "aria-label": `Edit ${entry.item.author}'s ${entry.item.kind} of ${when(entry.item.at)}`,
        onsubmit: (event) => {
          event.preventDefault();
          submit();
        },
      },
      field("Payload (JSON)", text),
      save,
      cancel,
      notice,
    );
    const editor = {
      form,
      text,
      version: entry.item.version ?? 1,
      saving: false,
      /** Whether the notice offers to reload (a save was refused, or the entry is gone). */
      conflict: false,
      say(message, offerReload = false) {
        editor.conflict = offerReload;
        note.textContent = message;
        reload.hidden = !offerReload;
        notice.classList.toggle("conflict", offerReload);
        notice.hidden = false;
      },
    };
    entry.editor = editor;
    entry.node.classList.add("editing");
    if (entry.editButton) entry.editButton.hidden = true;
    entry.node.append(form);
    text.focus();

    async function submit() {
      let payload;
      try {
        payload = JSON.parse(text.value);
      } catch (error) {
        showError({ message: `not JSON: ${error.message}` });
        return;
      }
      const { author, event_id: eventId } = entry.item;
      editor.saving = true;
      save.disabled = true;
      try {
        const answer = await api("PATCH", `/v1/subjects/${seg(author)}/events/${seg(eventId)}`, {
          payload,
          version: editor.version,
        });
        showError(null);
        update({ event_id: eventId, payload: answer.payload, version: answer.version, edited_at: answer.edited_at });
        closeEditor(entry);
      } catch (error) {
        if (error instanceof ApiError && error.code === "version_conflict") {
          showError(null);
          editor.say(error.message, true);
        } else {
          showError(error);
        }
      } finally {
        editor.saving = false;
        save.disabled = false;
      }
    }

    async function reloadCurrent() {
      reload.disabled = true;
      const found = await reread(entry.item.event_id);
      reload.disabled = false;
      if (found === undefined) return;
      if (!entries.has(entry.item.row_key)) return;
      if (!found) {
        editor.say("This entry is no longer on the first pages of the timeline: it may have been deleted.", true);
        return;
      }
      editor.version = entry.item.version ?? 1;
      editor.say(
        `Reloaded version ${editor.version} (shown above). Your text is kept: Save replaces that version with it.`,
      );
      text.focus();
    }
  }

  function closeEditor(entry) {
    if (!entry.editor) return;
    const hadFocus = entry.editor.form.contains(document.activeElement);
    entry.editor.form.remove();
    entry.editor = null;
    entry.node.classList.remove("editing");
    if (entry.editButton) {
      entry.editButton.hidden = false;
      if (hadFocus) entry.editButton.focus();
    }
  }

  function paintMarker() {
    markerText.textContent = `Unread: ${marker.unread}`;
    none.hidden = entries.size > 0;
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

  function onEvent(type, value) {
    if (type === "entry") {
      // A new entry newer than the marker is one more unread.
      const unread = !entries.has(value.row_key) && (marker.last_read === null || value.row_key < marker.last_read);
      add(value);
      if (unread) marker.unread += 1;
      paintMarker();
    } else if (type === "updated") {
      // The entry's event was edited: show it as it is now, where it is.
      update(value);
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
      feed?.close();
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
      el("div", { class: "meta" }, `${item.kind} · `, el("time", { datetime: item.at }, when(item.at)), editedMark(item) ? [" · ", editedMark(item)] : null),
      el("pre", { class: "payload" }, payloadText(item.payload)),
      own ? el("div", {}, check, status) : null,
    );
  }

  let cursor = null;
  async function loadEvents() {
    const page = await attempt(() => api("GET", `${base}/events${query({ limit: PAGE, cursor })}`));
    if (!page) return;
    page.items.forEach((item) => events.append(eventNode(item)));
    if (!cursor && !page.items.length) events.append(el("li", { class: "status empty" }, `${subject} has posted nothing yet.`));
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
    if (!page.items.length) list.append(el("li", { class: "status empty" }, "none yet"));
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
