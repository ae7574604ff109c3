// Series: the catalogue listed at once (a page at a time), narrowed by prefix or tag; chart
// one or several over a range (raw, or stepped with a step picked from the range), extended
// live from each series' stream; tags, editable.
import { api, query, seg } from "./api.js";
import { timeChart } from "./chart.js";
import { openStream } from "./sse.js";
import { attempt, el, field, showError } from "./ui.js";

const RANGES = [["15m", 900], ["1h", 3600], ["6h", 21600], ["24h", 86400], ["7d", 604800], ["30d", 2592000], ["90d", 7776000], ["1y", 31536000]];
const STEPS = [["1s", 1], ["5s", 5], ["15s", 15], ["1m", 60], ["5m", 300], ["15m", 900], ["1h", 3600], ["6h", 21600], ["1d", 86400]];
const AGGS = ["avg", "min", "max", "sum", "count", "first", "last"];
/** Buckets a stepped chart aims at, at most. */
const BUCKETS = 400;
/** Names listed a page at a time. */
const NAMES_PAGE = 50;

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
  let namesCursor = null;
  /** What the names shown were asked for (the next page asks for the same). */
  let listed = { prefix: "", wanted: "" };
  let finds = 0;

  const start = el("input", { id: "series-start", name: "start", value: params.get("start") || "", placeholder: "field-7/" });
  const tag = el("input", { id: "series-tag", name: "tag", value: params.get("tag") || "", placeholder: "site:field-7" });
  const found = el("ul", { id: "series-found", class: "picks", "aria-label": "Series" });
  const more = el("button", { type: "button", id: "series-more", class: "secondary", hidden: true, onclick: () => find(namesCursor) }, "More series");
  const rangeSelect = select("range", RANGES.map(([name]) => name), range);
  const modeSelect = select("mode", ["raw", "stepped"], mode);
  const aggSelect = select("agg", AGGS, agg);
  const chartBox = el("div", { id: "chart", class: "chart", role: "img", "aria-label": "Chart of the chosen series", hidden: true });
  const tagsBox = el("div", { id: "series-tags" });
  const status = el("p", { id: "chart-status", class: "status" });

  root.append(
    el("h2", {}, "Series"),
    el("form", { id: "series-find", onsubmit: (event) => { event.preventDefault(); find(); } },
      field("Name prefix", start), field("Tag", tag), el("button", { type: "submit" }, "Find")),
    found,
    more,
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

  /**
   * Lists the catalogue (all of it, or the names with the prefix or tag), a page at a time:
   * the first page, or the one after `cursor` below those shown.
   */
  async function find(cursor = null) {
    if (!cursor) listed = { prefix: start.value.trim(), wanted: tag.value.trim() };
    const { prefix, wanted } = listed;
    const asked = ++finds;
    const page = await attempt(() => api("GET", `/v1/series${query({ start: prefix, tag: wanted, limit: NAMES_PAGE, cursor })}`));
    // A later search (or page) replaced this one.
    if (!page || asked !== finds) return;
    const items = page.items.filter((name) => name.startsWith(prefix));
    if (!cursor) found.replaceChildren();
    found.querySelector(".status")?.remove();
    const shown = found.querySelectorAll("input").length;
    found.append(...items.map((name, index) =>
      el("li", {}, el("label", { class: "check" }, el("input", { type: "checkbox", id: `pick-${shown + index}`, value: name, checked: names.includes(name) }), ` ${name}`))));
    // Names come in name order: once one lacks the prefix, none after it has it.
    namesCursor = items.length === page.items.length ? page.next_cursor : null;
    more.hidden = !namesCursor;
    if (!found.querySelector("input")) {
      found.append(el("li", { class: "status empty" }, prefix || wanted
        ? "No series matches."
        : "No series yet: write points (POST /v1/series/{series}/points, line protocol or MQTT) and they are listed here."));
    }
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
    chartBox.hidden = false;
    if (!chart) {
      chart = timeChart(chartBox, {
        data: table,
        series: names.map((name) => ({ label: name, spanGaps: mode === "stepped" })),
      });
    } else {
      chart.setData(table);
    }
    status.textContent = `${names.join(", ")}: ${table[0].length} ${mode === "stepped" ? `buckets of ${stepFor(span.to - span.from)} (${agg})` : "points"}`;
  }

  function closeStreams() {
    streams.splice(0).forEach((stream) => stream.close());
  }

  function onPoints(name, value) {
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
      status.textContent = "Tick one or more series above, then Draw.";
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
          onEvent: (type, value) => {
            if (type === "points") onPoints(name, value);
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

  find();
  draw();
  return {
    close() {
      closeStreams();
      clearTimeout(refetch);
      chart?.destroy();
    },
  };
}
