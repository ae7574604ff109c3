// Admin: issue and revoke subject and device tokens; dead-lettered fan-outs, with requeue.
import { api, query, seg } from "./api.js";
import { attempt, el, field, showError, when } from "./ui.js";

export function adminView(root) {
  const issued = el("div", { id: "issued", "aria-live": "polite" });

  function issueForm(id, label, path) {
    const input = el("input", { id, name: id, required: true });
    return el("form", {
      onsubmit: async (event) => {
        event.preventDefault();
        const answer = await attempt(() => api("POST", path(input.value.trim()), {}));
        if (answer) showIssued(answer, input.value.trim());
      },
    }, field(label, input), el("button", { type: "submit" }, "Issue token"));
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

  const owner = el("input", { id: "tokens-of", name: "tokens-of", required: true });
  const tokens = el("tbody", { id: "tokens" });
  async function listTokens() {
    const page = await attempt(() => api("GET", `/v1/admin/tokens${query({ subject: owner.value.trim() })}`));
    if (!page) return;
    tokens.replaceChildren(...page.items.map((token) => el("tr", {},
      el("td", {}, token.token_id), el("td", {}, token.kind), el("td", {}, token.name), el("td", {}, when(token.created_at)),
      el("td", {}, el("button", {
        type: "button",
        class: "secondary",
        "aria-label": `Revoke token ${token.token_id}`,
        onclick: async () => {
          const done = await attempt(async () => { await api("DELETE", `/v1/admin/tokens/${seg(token.token_id)}`); return true; });
          if (done) listTokens();
        },
      }, "Revoke")))));
  }

  const deadSubject = el("input", { id: "dead-subject", name: "dead-subject", required: true });
  const dead = el("tbody", { id: "dead-letters" });
  async function listDead() {
    const subject = deadSubject.value.trim();
    const page = await attempt(() => api("GET", `/v1/admin/fanout/${seg(subject)}/dead-letters${query({ limit: 100 })}`));
    if (!page) return;
    dead.replaceChildren(...page.items.map((job) => {
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
    }));
    if (!page.items.length) dead.append(el("tr", {}, el("td", { colspan: "7" }, "nothing dead-lettered")));
  }

  root.append(
    el("h2", {}, "Tokens"),
    issueForm("issue-subject", "Subject to issue a token for", (name) => `/v1/admin/subjects/${seg(name)}/tokens`),
    issueForm("issue-series", "Series to issue a device token for", (name) => `/v1/admin/series/${seg(name)}/tokens`),
    issued,
    el("form", { onsubmit: (event) => { event.preventDefault(); listTokens(); } },
      field("Tokens of (subject or series)", owner), el("button", { type: "submit" }, "List tokens")),
    el("table", {}, el("thead", {}, el("tr", {}, ["Token id", "Kind", "Name", "Created", ""].map((text) => el("th", {}, text)))), tokens),
    el("h2", {}, "Dead letters"),
    el("form", { onsubmit: (event) => { event.preventDefault(); listDead(); } },
      field("Subject whose failed fan-outs to list", deadSubject), el("button", { type: "submit" }, "List dead letters")),
    el("table", {}, el("thead", {}, el("tr", {}, ["Event", "Operation", "Attempts", "Error", "Dead since", "State", ""].map((text) => el("th", {}, text)))), dead),
  );
  return { close() {} };
}
