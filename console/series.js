// Series: find by prefix or tag, chart one or several over a range (raw, or stepped with a
// step picked from the range), extended live from each series' stream; tags, editable.
import uPlot from "./vendor/uplot/uPlot.esm.js";
import { api, query, seg } from "./api.js";
import { openStream } from "./sse.js";
import { attempt, el, field, showError } from "./ui.js";

const RANGES = [["15m", 900], ["1h", 3600], ["6h", 21600], ["24h", 86400], ["7d", 604800], ["30d", 2592000]];
const STEPS = [["1s", 1], ["5s", 5], ["15s", 15], ["1m", 60], ["5m", 300], ["15m", 900], ["1h", 3600], ["6h", 21600], ["1d", 86400]];
const AGGS = ["avg", "min", "max", "sum", "count", "first", "last"];
const COLORS = ["#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989"];
/** Buckets a stepped chart aims at, at most. */
const BUCKETS = 400;

/** The smallest step that keeps `seconds` within `BUCKETS` buckets. */
export function stepFor(seconds) {
  return (STEPS.find(([, step]) => seconds / step <= BUCKETS) || STEPS[STEPS.length - 1])[0];
}

function select(id, options, value) {
  return el("select", { id, name: id }, options.map((option) => el("option", { value: option, selected: option === value }, option)));
}

export function seriesView(root, { params, setFragment }) {
  let names = (params.get("series") || "").split(",").filter(Boolean);
  let range = params.get("range") || "1h";
  let mode = params.get("mode") || "raw";
  let agg = params.get("agg") || "avg";
  const streams = [];
  let chart = null;
  let data = new Map();
  let span = { from: 0, to: 0 };
  let refetch = null;

  const start = el("input", { id: "series-start", name: "start", value: params.get("start") || "" });
  const tag = el("input", { id: "series-tag", name: "tag", value: params.get("tag") || "" });
  const found = el("ul", { id: "series-found", "aria-label": "Series found" });
  const rangeSelect = select("range", RANGES.map(([name]) => name), range);
  const modeSelect = select("mode", ["raw", "stepped"], mode);
  const aggSelect = select("agg", AGGS, agg);
  const chartBox = el("div", { id: "chart", class: "chart", role: "img", "aria-label": "Chart of the chosen series" });
  const tagsBox = el("div", { id: "series-tags" });
  const status = el("p", { id: "chart-status", class: "status" });

  root.append(
    el("h2", {}, "Series"),
    el("form", { id: "series-find", onsubmit: (event) => { event.preventDefault(); find(); } },
      field("Name prefix", start), field("Tag", tag), el("button", { type: "submit" }, "Find")),
    found,
    el("form", { id: "series-chart", onsubmit: (event) => { event.preventDefault(); choose(); } },
      field("Range (until now)", rangeSelect), field("Points", modeSelect), field("Aggregate (stepped)", aggSelect),
      el("button", { type: "submit" }, "Draw")),
    status,
    chartBox,
    tagsBox,
  );

  function remember() {
    setFragment({ view: "series", series: names.join(","), range, mode, agg: mode === "stepped" ? agg : undefined, start: start.value, tag: tag.value });
  }

  async function find() {
    const prefix = start.value.trim();
    const page = await attempt(() => api("GET", `/v1/series${query({ start: prefix, tag: tag.value.trim(), limit: 100 })}`));
    if (!page) return;
    const items = page.items.filter((name) => name.startsWith(prefix));
    found.replaceChildren(...items.map((name, index) =>
      el("li", {}, el("label", {}, el("input", { type: "checkbox", id: `pick-${index}`, value: name, checked: names.includes(name) }), ` ${name}`))));
    if (!items.length) found.append(el("li", { class: "status" }, "no series found"));
    remember();
  }

  function choose() {
    const picked = [...found.querySelectorAll("input:checked")].map((input) => input.value);
    if (picked.length) names = picked;
    range = rangeSelect.value;
    mode = modeSelect.value;
    agg = aggSelect.value;
    remember();
    draw();
  }

  async function fetchSeries(name) {
    const points = new Map();
    let cursor = null;
    const seconds = span.to - span.from;
    const stepping = mode === "stepped" ? { step: stepFor(seconds), agg } : {};
    for (let pages = 0; pages < 10; pages++) {
      const page = await api("GET", `/v1/series/${seg(name)}/points${query({
        from: new Date(span.from * 1000).toISOString(),
        to: new Date(span.to * 1000).toISOString(),
        limit: 10000,
        cursor,
        ...stepping,
      })}`);
      for (const point of page.items) points.set(Date.parse(point.at) / 1000, point.value);
      cursor = page.next_cursor;
      if (!cursor) break;
    }
    return points;
  }

  function columns() {
    const xs = [...new Set([...data.values()].flatMap((points) => [...points.keys()]))].sort((a, b) => a - b);
    return [xs, ...names.map((name) => xs.map((x) => (data.get(name)?.has(x) ? data.get(name).get(x) : null)))];
  }

  function paint() {
    const table = columns();
    chartBox.dataset.points = String(table[0].length);
    const width = Math.max(280, chartBox.clientWidth || 600);
    if (!chart) {
      chart = new uPlot({
        width,
        height: 300,
        scales: { x: { time: true } },
        series: [{ label: "time" }, ...names.map((name, index) => ({ label: name, stroke: COLORS[index % COLORS.length], width: 2, spanGaps: mode === "stepped" }))],
      }, table, chartBox);
    } else {
      chart.setData(table);
    }
    status.textContent = `${names.join(", ")}: ${table[0].length} ${mode === "stepped" ? `buckets of ${stepFor(span.to - span.from)} (${agg})` : "points"}`;
  }

  function closeStreams() {
    streams.splice(0).forEach((stream) => stream.close());
  }

  function onPoints(name, raw) {
    let value;
    try {
      value = JSON.parse(raw);
    } catch {
      return;
    }
    span.to = Math.max(span.to, Date.now() / 1000);
    if (mode === "stepped") {
      clearTimeout(refetch);
      refetch = setTimeout(() => draw(true), 1000);
      return;
    }
    const points = data.get(name);
    for (const point of value.points || []) points.set(Date.parse(point.at) / 1000, point.value);
    paint();
  }

  async function draw(keepStreams = false) {
    if (!names.length) {
      status.textContent = "Find series above and pick some to chart.";
      return;
    }
    const seconds = RANGES.find(([name]) => name === range)?.[1] || 3600;
    span = { to: Date.now() / 1000 + 60, from: Date.now() / 1000 - seconds };
    const loaded = await attempt(async () => {
      const next = new Map();
      for (const name of names) next.set(name, await fetchSeries(name));
      return next;
    });
    if (!loaded) return;
    data = loaded;
    if (chart) {
      chart.destroy();
      chart = null;
    }
    chartBox.replaceChildren();
    paint();
    showTags();
    if (!keepStreams) {
      closeStreams();
      for (const name of names) {
        streams.push(openStream(`/v1/series/${seg(name)}/stream`, {
          onEvent: (type, raw) => {
            if (type === "points") onPoints(name, raw);
            else if (type === "lagged") draw(true);
          },
          onError: (error) => showError(error),
          onState: (text) => { chartBox.dataset.stream = text; },
        }));
      }
    }
  }

  async function showTags() {
    tagsBox.replaceChildren(el("h3", {}, "Tags"));
    for (const [index, name] of names.entries()) {
      const answer = await attempt(() => api("GET", `/v1/series/${seg(name)}/tags`));
      const input = el("input", { id: `tags-${index}`, name: `tags-${index}`, value: answer ? answer.tags.join(", ") : "" });
      tagsBox.append(el("form", {
        onsubmit: async (event) => {
          event.preventDefault();
          const tags = input.value.split(",").map((text) => text.trim()).filter(Boolean);
          const saved = await attempt(() => api("PUT", `/v1/series/${seg(name)}/tags`, { tags }));
          if (saved) input.value = saved.tags.join(", ");
        },
      }, field(`Tags of ${name} (comma separated)`, input), el("button", { type: "submit" }, "Save tags")));
    }
  }

  if (start.value || tag.value) find();
  draw();
  return {
    close() {
      closeStreams();
      clearTimeout(refetch);
      chart?.destroy();
    },
  };
}
