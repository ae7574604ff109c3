// Admin: issue and revoke subject and device tokens; dead-lettered fan-outs, with requeue.
import { api, query, seg } from "./api.js";
import { attempt, el, field, showError, when } from "./ui.js";

export function adminView(root, { params }) {
  const issued = el("div", { id: "issued", "aria-live": "polite" });

  function issueForm(id, label, placeholder, button, path) {
    const input = el("input", { id, name: id, required: true, placeholder });
    return el("form", {
      onsubmit: async (event) => {
        event.preventDefault();
        const answer = await attempt(() => api("POST", path(input.value.trim()), {}));
        if (answer) showIssued(answer, input.value.trim());
      },
    }, field(label, input), el("button", { type: "submit" }, button));
  }

  function showIssued(answer, name) {
    const copy = el("button", {
      type: "button",
      class: "secondary",
      onclick: () => navigator.clipboard.writeText(answer.token).then(
        () => { copy.textContent = "Copied"; },
        (error) => showError({ message: `could not copy: ${error.message}` }),
      ),
    }, "Copy");
    issued.replaceChildren(
      el("p", {}, `New token for ${name} (id ${answer.token_id}). It is shown this once: copy it now.`),
      el("p", { class: "token", id: "issued-token" }, answer.token),
      copy,
    );
  }

  /**
   * A table that is shown only with rows in it; otherwise a line says why it is empty.
   * `show(rows, emptyText)` fills it.
   */
  function table(id, headings, emptyText) {
    const body = el("tbody", { id });
    const empty = el("p", { class: "status empty", id: `${id}-empty` }, emptyText);
    const node = el("table", { hidden: true },
      el("thead", {}, el("tr", {}, headings.map((text) => el("th", { scope: "col" }, text)))), body);
    return {
      nodes: [empty, node],
      show(rows, text) {
        body.replaceChildren(...rows);
        empty.textContent = text;
        empty.hidden = rows.length > 0;
        node.hidden = rows.length === 0;
      },
    };
  }

  const owner = el("input", { id: "tokens-of", name: "tokens-of", required: true, placeholder: "alice or field-7/soil_temp" });
  const tokenTable = table("tokens", ["Token id", "Kind", "Name", "Created", ""], "No tokens listed yet: name a subject or series above.");
  async function listTokens() {
    const name = owner.value.trim();
    const page = await attempt(() => api("GET", `/v1/admin/tokens${query({ subject: name })}`));
    if (!page) return;
    tokenTable.show(page.items.map((token) => el("tr", {},
      el("td", {}, token.token_id), el("td", {}, token.kind), el("td", {}, token.name), el("td", {}, when(token.created_at)),
      el("td", {}, el("button", {
        type: "button",
        class: "secondary",
        "aria-label": `Revoke token ${token.token_id}`,
        onclick: async () => {
          const done = await attempt(async () => { await api("DELETE", `/v1/admin/tokens/${seg(token.token_id)}`); return true; });
          if (done) listTokens();
        },
      }, "Revoke")))), `${name} has no tokens.`);
  }

  const deadSubject = el("input", { id: "dead-subject", name: "dead-subject", required: true, placeholder: "alice" });
  const deadTable = table("dead-letters", ["Event", "Operation", "Attempts", "Error", "Dead since", "State", ""],
    "No dead letters listed yet: name a subject above. (The overview counts the fan-outs given up since the start.)");
  async function listDead() {
    const subject = deadSubject.value.trim();
    const page = await attempt(() => api("GET", `/v1/admin/fanout/${seg(subject)}/dead-letters${query({ limit: 100 })}`));
    if (!page) return;
    deadTable.show(page.items.map((job) => {
      const state = el("td", {});
      return el("tr", {},
        el("td", {}, job.event_id), el("td", {}, job.operation), el("td", {}, String(job.attempts)),
        el("td", {}, job.error), el("td", {}, when(job.dead_at)), state,
        el("td", {}, el("button", {
          type: "button",
          "aria-label": `Requeue ${job.event_id}`,
          onclick: async () => {
            const answer = await attempt(() => api("POST", `/v1/admin/fanout/${seg(subject)}/${seg(job.event_id)}/requeue`, {}));
            if (answer) state.textContent = answer.state;
          },
        }, "Requeue")));
    }), `Nothing of ${subject} is dead-lettered.`);
  }

  const deadHeading = el("h2", { id: "dead-letters-heading", tabindex: "-1" }, "Dead letters");
  root.append(
    el("h2", {}, "Tokens"),
    issueForm("issue-subject", "Subject to issue a token for", "alice", "Issue subject token", (name) => `/v1/admin/subjects/${seg(name)}/tokens`),
    issueForm("issue-series", "Series to issue a device token for", "field-7/soil_temp", "Issue device token", (name) => `/v1/admin/series/${seg(name)}/tokens`),
    issued,
    el("form", { onsubmit: (event) => { event.preventDefault(); listTokens(); } },
      field("Tokens of (subject or series)", owner), el("button", { type: "submit" }, "List tokens")),
    ...tokenTable.nodes,
    deadHeading,
    el("form", { onsubmit: (event) => { event.preventDefault(); listDead(); } },
      field("Subject whose failed fan-outs to list", deadSubject), el("button", { type: "submit" }, "List dead letters")),
    ...deadTable.nodes,
  );
  // The overview's "dead letters" figure links here.
  if (params.get("focus") === "dead-letters") {
    deadHeading.scrollIntoView();
    deadSubject.focus();
  }
  return { close() {} };
}
