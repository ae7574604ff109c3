// The operator's overview, the admin's first view: `GET /v1/admin/overview` every 2 s while
// the view is open and the tab visible. Each figure says what it covers: "service" is what
// the store tells, the same from every process sharing it (the backlog); "this process" is
// the process serving the console (rates, lag, streams, intake), which with
// `serve --workers 0` fans out nothing itself.
import { ApiError, api } from "./api.js";
import { clock, day, number, timeChart } from "./chart.js";
import { el, showError } from "./ui.js";

const POLL_MS = 2000;

const count = new Intl.NumberFormat("en");
const rate = new Intl.NumberFormat("en", { maximumFractionDigits: 1 });

/** A duration in milliseconds, in the unit that reads best: `850 ms`, `12.3 s`, `4 min 5 s`. */
export function duration(ms) {
  if (ms === null || ms === undefined) return "none";
  if (ms < 1000) return `${rate.format(ms)} ms`;
  const seconds = ms / 1000;
  if (seconds < 60) return `${rate.format(seconds)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ${Math.floor(seconds % 60)} s`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

/** `26.6 / 492.2 ms`: p50 and p99, in one unit when both read well in milliseconds. */
function lagText(p50, p99) {
  if (p99 === null || p99 === undefined) return "none";
  const ms = (value) => (value < 10 ? rate.format(value) : count.format(Math.round(value)));
  if (p99 < 1000) return `${ms(p50)} / ${ms(p99)} ms`;
  return `${duration(p50)} / ${duration(p99)}`;
}

/**
 * One figure: a label, its value, a line saying what it covers, and optionally one more
 * (`extra`). `set(text, detail, raw)` shows a new value; `raw` goes to `data-value`, for
 * tests and scripts.
 */
function figure(name, label, covers, extra = null) {
  const value = el("dd", { class: "value" }, "…");
  const detail = el("dd", { class: "covers" }, covers);
  const node = el("div", { class: "figure", dataset: { figure: name } },
    el("dt", {}, label), value, detail, extra ? el("dd", { class: "covers" }, extra) : null);
  return {
    node,
    set(text, more, raw) {
      value.textContent = text;
      detail.textContent = more === undefined ? covers : more;
      if (raw !== undefined) node.dataset.value = String(raw);
    },
  };
}

/** A small history chart in a captioned figure. */
function historyChart(name, caption) {
  const box = el("div", { class: "chart small", id: `history-${name}`, role: "img", "aria-label": caption });
  return { box, node: el("figure", { class: "history" }, el("figcaption", {}, caption), box), chart: null };
}

export function overviewView(root) {
  const status = el("p", { id: "overview-status", class: "status", "aria-live": "off" }, "Reading the overview…");
  const workersNote = el("p", { id: "overview-workers", class: "note", hidden: true });
  const backlogFull = el("p", { id: "overview-backlog-full", class: "note bad", role: "status", hidden: true });

  const backlog = figure("backlog", "Backlog", "fan-out jobs waiting or running");
  const oldest = figure("oldest-job", "Oldest waiting job", "how long it has waited");
  const events = figure("events", "Events", "posted here, a second, over the last 10 s");
  const deliveries = figure("deliveries", "Deliveries", "timeline entries written, a second, over the last 10 s");
  const lag = figure("lag", "Fan-out lag p50 / p99", "posting to fan-out done, last minute");
  const streams = figure("streams", "Open streams", "timeline and series streams, now");
  const connections = figure("connections", "Open connections", "HTTP, now");
  const dead = figure("dead-letters", "Dead letters", "fan-outs given up since the start",
    el("a", { href: "#view=admin&focus=dead-letters", id: "overview-dead-letters" }, "List and requeue them (Admin)"));
  const mqtt = figure("mqtt", "MQTT", "subscriber to the broker");

  const intakeRows = new Map([["line_protocol", "Line protocol"], ["json", "JSON"], ["mqtt", "MQTT"]].map(([key, label]) => {
    const perSecond = el("td", { class: "number" }, "…");
    const total = el("td", { class: "number" }, "…");
    return [key, { row: el("tr", { dataset: { intake: key } }, el("th", { scope: "row" }, label), perSecond, total), perSecond, total }];
  }));

  const charts = {
    rates: historyChart("rates", "Events/s and deliveries/s (this process)"),
    backlog: historyChart("backlog", "Backlog (service)"),
    lag: historyChart("lag", "Fan-out lag p99, ms (this process)"),
    points: historyChart("points", "Points/s, every intake (this process)"),
  };

  const processCovers = el("span", { class: "covers", id: "overview-process-covers" }, "the process serving this console");
  root.append(
    el("div", { class: "heading-row" }, el("h2", {}, "Overview"), status),
    backlogFull,
    el("section", { class: "group", "aria-labelledby": "overview-service" },
      el("h3", { id: "overview-service" }, "Service ", el("span", { class: "covers" }, "what the store tells, for every process sharing it")),
      el("dl", { class: "figures" }, backlog.node, oldest.node)),
    el("section", { class: "group", "aria-labelledby": "overview-process" },
      el("h3", { id: "overview-process" }, "This process ", processCovers),
      workersNote,
      el("dl", { class: "figures" }, events.node, deliveries.node, lag.node, streams.node, connections.node, dead.node, mqtt.node),
      el("table", { id: "intake", class: "intake" },
        el("caption", {}, "Series intake"),
        el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Intake"), el("th", { scope: "col", class: "number" }, "Points/s (last 10 s)"), el("th", { scope: "col", class: "number" }, "Points since the start"))),
        el("tbody", {}, [...intakeRows.values()].map(({ row }) => row)))),
    el("section", { class: "group", "aria-labelledby": "overview-history" },
      el("h3", { id: "overview-history" }, "Last 10 minutes ", el("span", { class: "covers" }, "one sample every 2 s; rates over each sample")),
      el("div", { class: "histories" }, Object.values(charts).map(({ node }) => node))),
  );

  function paint(answer) {
    const { service, process, history } = answer;
    root.dataset.at = answer.at;

    const limit = service.backlog_limit ? `of ${count.format(service.backlog_limit)} allowed` : "no limit";
    backlog.set(count.format(service.backlog), `${service.backlog_full ? "FULL" : "fan-out jobs waiting or running"} · ${limit}`, service.backlog);
    backlog.node.classList.toggle("bad", service.backlog_full);
    backlogFull.hidden = !service.backlog_full;
    backlogFull.textContent = service.backlog_full
      ? `The backlog is full (${count.format(service.backlog_limit)} jobs): posts are refused with 503 backlog_full until it drains.`
      : "";
    oldest.set(service.oldest_job_age_ms === null ? "none waiting" : duration(service.oldest_job_age_ms), undefined, service.oldest_job_age_ms ?? "");

    const started = new Date(process.started_at);
    processCovers.textContent = `since ${day(started)} ${clock(started)}, ` +
      `${process.workers} fan-out worker${process.workers === 1 ? "" : "s"}`;
    workersNote.hidden = process.workers !== 0;
    workersNote.textContent = process.workers === 0
      ? "This process runs no fan-out workers (serve --workers 0): other processes do the fan-out, so deliveries, lag and dead letters here stay at zero. The backlog above covers them all."
      : "";

    events.set(`${rate.format(process.events_per_s)}/s`, `posted here, over the last 10 s · ${count.format(process.events)} since the start`, process.events_per_s);
    events.node.dataset.total = String(process.events);
    deliveries.set(`${rate.format(process.deliveries_per_s)}/s`, `timeline entries written, over the last 10 s · ${count.format(process.deliveries)} since the start`, process.deliveries_per_s);
    deliveries.node.dataset.total = String(process.deliveries);
    lag.set(
      lagText(process.fanout_lag_p50_ms, process.fanout_lag_p99_ms),
      process.fanout_lag_p99_ms === null ? "no fan-out ended here in the last minute" : "posting to fan-out done, last minute (within 20 %)",
      process.fanout_lag_p99_ms ?? "",
    );
    streams.set(count.format(process.streams_open), undefined, process.streams_open);
    connections.set(count.format(process.connections_open), undefined, process.connections_open);
    dead.set(count.format(process.dead_letters), undefined, process.dead_letters);
    dead.node.classList.toggle("bad", process.dead_letters > 0);
    mqtt.set(
      process.mqtt_connected === null ? "not configured" : process.mqtt_connected ? "connected" : "disconnected",
      process.mqtt_connected === null ? "no broker set (--mqtt-url)" : "subscriber to the broker",
      process.mqtt_connected === null ? "none" : String(process.mqtt_connected),
    );
    mqtt.node.classList.toggle("bad", process.mqtt_connected === false);
    for (const [key, { perSecond, total }] of intakeRows) {
      perSecond.textContent = rate.format(process.points_per_s[key]);
      total.textContent = count.format(process.points[key]);
    }

    const xs = history.map((sample) => Date.parse(sample.at) / 1000);
    const column = (name) => history.map((sample) => sample[name]);
    draw(charts.rates, [xs, column("events_per_s"), column("deliveries_per_s")], [{ label: "events/s" }, { label: "deliveries/s" }]);
    draw(charts.backlog, [xs, column("backlog")], [{ label: "backlog" }]);
    draw(charts.lag, [xs, column("fanout_lag_p99_ms")], [{ label: "lag p99 ms" }]);
    draw(charts.points, [xs, column("points_per_s")], [{ label: "points/s" }]);

    const now = new Date(answer.at);
    status.textContent = `Live, every ${POLL_MS / 1000} s: read at ${clock(now)}`;
    root.dataset.state = "live";
  }

  function draw(slot, data, series) {
    if (slot.chart) slot.chart.setData(data);
    else slot.chart = timeChart(slot.box, { data, series, height: 170, valueFormat: number });
  }

  let timer = null;
  let closed = false;
  let reading = false;
  let shownError = false;

  async function poll() {
    timer = null;
    if (closed || document.hidden || reading) return;
    reading = true;
    try {
      const answer = await api("GET", "/v1/admin/overview");
      if (closed) return;
      if (shownError) showError(null);
      shownError = false;
      paint(answer);
    } catch (error) {
      if (closed) return;
      showError(error);
      shownError = true;
      root.dataset.state = "error";
      // A refused token will not be let in by asking again.
      if (error instanceof ApiError && (error.status === 401 || error.status === 403)) {
        status.textContent = "Stopped: the token may not read the overview.";
        closed = true;
        return;
      }
      status.textContent = `Not read (${error.message}); trying again every ${POLL_MS / 1000} s.`;
    } finally {
      reading = false;
    }
    schedule();
  }

  function schedule() {
    clearTimeout(timer);
    timer = closed || document.hidden ? null : setTimeout(poll, POLL_MS);
  }

  function onVisibility() {
    if (document.hidden) {
      clearTimeout(timer);
      timer = null;
      status.textContent = "Paused while the tab is hidden.";
      root.dataset.state = "paused";
    } else if (!closed && !timer && !reading) {
      poll();
    }
  }

  document.addEventListener("visibilitychange", onVisibility);
  poll();
  return {
    close() {
      closed = true;
      clearTimeout(timer);
      document.removeEventListener("visibilitychange", onVisibility);
      for (const slot of Object.values(charts)) slot.chart?.destroy();
    },
  };
}
