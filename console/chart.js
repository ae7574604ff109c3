// Time charts (uPlot) shared by the series and overview views: a time axis whose ticks fit
// the range (seconds to years, never sub-second, the date shown once and never cut off), a
// legend that shows the values under the cursor (and the latest ones when the cursor is
// elsewhere, never `--`), and a width that follows the chart's box.
import uPlot from "./vendor/uplot/uPlot.esm.js";

export const COLORS = ["#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989"];

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
const MINUTE = 60;
const HOUR = 3600;
const DAY = 86400;
const MONTH = 30 * DAY;
const YEAR = 365 * DAY;

/**
 * Tick steps in seconds, from one second up: uPlot picks the smallest that leaves room
 * between labels, and lays months and years on calendar boundaries (its steps of 30 and 365
 * days mean "a month" and "a year").
 */
const TIME_INCRS = [
  1, 2, 5, 10, 15, 30,
  MINUTE, 2 * MINUTE, 5 * MINUTE, 10 * MINUTE, 15 * MINUTE, 30 * MINUTE,
  HOUR, 2 * HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR,
  DAY, 2 * DAY, 7 * DAY, 14 * DAY,
  MONTH, 2 * MONTH, 3 * MONTH, 6 * MONTH,
  YEAR, 2 * YEAR, 5 * YEAR, 10 * YEAR, 25 * YEAR, 50 * YEAR, 100 * YEAR,
];

/** Room the last tick's label needs right of the plot, in CSS pixels. */
const RIGHT_PAD = 44;

const pad2 = (n) => String(n).padStart(2, "0");

/** `10:00:05` (or `10:00` without seconds), local time. */
export function clock(date, seconds = true) {
  const text = `${pad2(date.getHours())}:${pad2(date.getMinutes())}`;
  return seconds ? `${text}:${pad2(date.getSeconds())}` : text;
}

/** `21 Nov 2026`, local time. */
export function day(date) {
  return `${date.getDate()} ${MONTHS[date.getMonth()]} ${date.getFullYear()}`;
}

/** A moment to the second (to the millisecond when it has some): `21 Nov 2026 10:00:05`. */
export function moment(date) {
  const millis = date.getMilliseconds();
  return `${day(date)} ${clock(date)}${millis ? `.${String(millis).padStart(3, "0")}` : ""}`;
}

/**
 * The labels of ticks at `splits` (seconds since the epoch) `incr` seconds apart: times of
 * day under a day apart (with seconds under a minute), with the date under the first tick and
 * wherever the day changes; days under a month; months (the year under the first and each
 * January); years.
 */
export function tickLabels(splits, incr) {
  let previousDay = null;
  let previousYear = null;
  return splits.map((split) => {
    const date = new Date(split * 1000);
    const year = date.getFullYear();
    const newYear = year !== previousYear;
    const dayKey = `${year}-${date.getMonth()}-${date.getDate()}`;
    const newDay = dayKey !== previousDay;
    previousYear = year;
    previousDay = dayKey;
    if (incr >= YEAR) return String(year);
    if (incr >= 28 * DAY) return newYear ? `${MONTHS[date.getMonth()]}\n${year}` : MONTHS[date.getMonth()];
    if (incr >= DAY) {
      const text = `${date.getDate()} ${MONTHS[date.getMonth()]}`;
      return newYear ? `${text}\n${year}` : text;
    }
    const text = clock(date, incr < MINUTE);
    return newDay ? `${text}\n${day(date)}` : text;
  });
}

/** A number for a legend or a figure: up to 6 significant digits, no float noise. */
export function number(value) {
  if (value === null || value === undefined) return "none";
  return String(Number(value.toPrecision(6)));
}

/** The last index of `values` that holds a number, or null. */
function lastIndex(values) {
  for (let index = values.length - 1; index >= 0; index--) {
    if (values[index] !== null && values[index] !== undefined) return index;
  }
  return null;
}

/**
 * A time chart in `box` of `series` (`{label, stroke?, spanGaps?}`) over `data`
 * (`[xs in seconds, ...values]`), as wide as `box`. The box's `data-points` says how many
 * x values it shows, `data-ticks` the x-axis labels drawn (JSON), and `data-ticks-fit`
 * whether every label lies wholly within the chart. Returns `{ setData(data), destroy() }`.
 */
export function timeChart(box, { series, data, height = 300, valueFormat = number }) {
  let ticks = [];
  let tickSplits = [];
  const options = {
    width: Math.max(240, box.clientWidth || 600),
    height,
    padding: [12, RIGHT_PAD, 0, 0],
    scales: {
      x: {
        time: true,
        // One point (or points a few ms apart) still gets a second of axis.
        range: (self, min, max) => (min === null || max === null ? [min, max] : max - min < 1 ? [min - 0.5, max + 0.5] : [min, max]),
      },
    },
    axes: [
      {
        // Room for a `10:00:00` label and a gap (uPlot's default of 50 px overlaps them).
        space: 72,
        incrs: TIME_INCRS,
        values: (self, splits, axisIndex, space, incr) => {
          tickSplits = splits;
          ticks = tickLabels(splits, incr);
          return ticks;
        },
      },
      { size: 60 },
    ],
    cursor: {
      // Under the cursor, each series shows its nearest point (not a gap of another's).
      hover: { skip: [null, undefined] },
    },
    legend: { live: true },
    series: [
      {
        label: "time",
        value: (self, x, seriesIndex, index) => {
          const shown = index ?? lastIndex(self.data[0]);
          return shown === null ? "no points" : moment(new Date(self.data[0][shown] * 1000));
        },
      },
      ...series.map((one, index) => ({
        stroke: COLORS[index % COLORS.length],
        width: 2,
        ...one,
        value: (self, raw, seriesIndex, at) => {
          const shown = at ?? lastIndex(self.data[seriesIndex]);
          const value = shown === null ? null : self.data[seriesIndex][shown];
          return value === null || value === undefined ? "none" : valueFormat(value);
        },
      })),
    ],
    hooks: {
      draw: [(self) => {
        box.dataset.ticks = JSON.stringify(ticks);
        box.dataset.ticksFit = String(ticksFit(self, tickSplits, ticks));
      }],
    },
  };
  box.dataset.points = String(data[0].length);
  const chart = new uPlot(options, data, box);
  const setData = (next) => {
    box.dataset.points = String(next[0].length);
    chart.setData(next);
  };
  // Resized on the next frame, not inside the observer: a resize that changes the box again
  // within the observer's callback is a "ResizeObserver loop" error.
  let frame = null;
  const resize = new ResizeObserver(() => {
    cancelAnimationFrame(frame);
    frame = requestAnimationFrame(() => {
      const width = Math.max(240, box.clientWidth);
      if (box.clientWidth && width !== chart.width) chart.setSize({ width, height });
    });
  });
  resize.observe(box);
  return {
    setData,
    chart,
    destroy() {
      cancelAnimationFrame(frame);
      resize.disconnect();
      chart.destroy();
    },
  };
}

/** Whether every x tick label drawn lies within the canvas (none is cut off). */
function ticksFit(self, splits, values) {
  const axis = self.axes[0];
  const context = self.ctx;
  context.save();
  context.font = axis.font[0];
  const canvasWidth = context.canvas.width;
  let fits = true;
  splits.forEach((split, index) => {
    if (values[index] === null || values[index] === undefined) return;
    const x = self.valToPos(split, "x", true);
    for (const line of String(values[index]).split("\n")) {
      const half = context.measureText(line).width / 2;
      if (x - half < 0 || x + half > canvasWidth) fits = false;
    }
  });
  context.restore();
  return fits;
}
