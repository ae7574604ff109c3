// The console's shell: sign-in, who the token acts as, and the view named in the fragment.
// The fragment holds the view, subject, series and range (never the token: a `#token=…`
// signs in and is taken out of the address bar at once).
import { api, setToken, token } from "./api.js";
import { attempt, showError } from "./ui.js";
import { timelineView, subjectView } from "./timeline.js";
import { seriesView } from "./series.js";
import { adminView } from "./admin.js";
import { overviewView } from "./overview.js";

const views = {
  overview: overviewView,
  timeline: timelineView,
  subject: subjectView,
  series: seriesView,
  admin: adminView,
};

let who = null;
let current = null;

/** The fragment as parameters, less the token. */
export function fragment() {
  return new URLSearchParams(location.hash.slice(1));
}

/** Replaces the fragment's parameters (a deep link), without a history entry per change. */
export function setFragment(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(key, value);
  }
  const hash = `#${search.toString()}`;
  if (hash !== location.hash) history.replaceState(null, "", hash);
}

/** Takes `token` out of the fragment into session storage. */
function takeFragmentToken() {
  const params = fragment();
  const value = params.get("token");
  if (value === null) return;
  params.delete("token");
  const rest = params.toString();
  history.replaceState(null, "", rest ? `#${rest}` : location.pathname + location.search);
  setToken(value.trim());
}

/** The admin lands on the overview, a subject on its timeline. */
function defaultView() {
  return who.kind === "device" ? "device" : who.kind === "admin" ? "overview" : "timeline";
}

function allowed(view) {
  if (view === "overview" || view === "series" || view === "admin") return who.kind === "admin";
  if (view === "timeline" || view === "subject") return who.kind !== "device";
  return false;
}

async function signIn() {
  const signInForm = document.getElementById("sign-in");
  if (!token()) {
    who = null;
    render();
    return;
  }
  const answer = await attempt(() => api("GET", "/v1/whoami"));
  if (!answer) {
    setToken(null);
    who = null;
    render(true);
    return;
  }
  who = answer;
  signInForm.hidden = true;
  render();
}

function render(keepError = false) {
  const signInForm = document.getElementById("sign-in");
  const nav = document.getElementById("nav");
  const whoText = document.getElementById("who");
  const signOut = document.getElementById("sign-out");
  const view = document.getElementById("view");
  if (current) current.close?.();
  current = null;
  view.replaceChildren();
  if (!keepError) showError(null);
  if (!who) {
    signInForm.hidden = false;
    nav.hidden = true;
    signOut.hidden = true;
    whoText.textContent = "";
    document.body.dataset.who = "";
    return;
  }
  signInForm.hidden = true;
  signOut.hidden = false;
  whoText.textContent =
    who.kind === "admin" ? "Signed in as the admin" : `Signed in as ${who.kind} ${who.name}`;
  document.body.dataset.who = who.kind;
  nav.hidden = who.kind === "device";
  for (const link of nav.querySelectorAll("a")) {
    link.hidden = !allowed(link.dataset.view);
  }
  const params = fragment();
  let name = params.get("view") || defaultView();
  if (!allowed(name)) name = defaultView();
  for (const link of nav.querySelectorAll("a")) {
    if (link.dataset.view === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (name === "device") {
    view.append(deviceView());
    return;
  }
  current = views[name](view, { who, params, setFragment, rerender: () => render() });
}

function deviceView() {
  const section = document.createElement("section");
  section.id = "device";
  const heading = document.createElement("h2");
  heading.textContent = "Device token";
  const text = document.createElement("p");
  text.textContent = `This token may only add points to the series ${who.name} ` +
    "(POST /v1/series/{series}/points). It reads nothing, so there is nothing to show here.";
  section.append(heading, text);
  return section;
}

function start() {
  document.getElementById("sign-in").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("token-input");
    setToken(input.value.trim());
    input.value = "";
    signIn();
  });
  document.getElementById("sign-out").addEventListener("click", () => {
    setToken(null);
    who = null;
    render();
  });
  window.addEventListener("hashchange", () => {
    if (fragment().has("token")) {
      takeFragmentToken();
      signIn();
    } else if (who) {
      render();
    }
  });
  takeFragmentToken();
  signIn();
}

start();
