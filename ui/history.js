// history.js - the last 15 minutes of the server's rates and gauges, for
// the overview's charts.
//
// The server keeps one sample a second for 15 minutes (GET /stats/history),
// so a page opened now shows the minutes before it. The page asks for it
// once, then extends it with each poll's GET /stats (which the app asks for
// anyway): a chart costs no request of its own. It asks again when the
// polls had a gap (a hidden tab, a server that did not answer) or the
// extension grew old, so what is shown stays the server's.

import * as api from "./api.js";
import {CHART_SECONDS} from "./widgets.js";

const REFETCH_AFTER_MS = 10 * 60 * 1000;   // ask the server again this often
const GAP_MS = 5000;                         // polls further apart: ask the server again

// The keys of a point, as GET /stats/history names its series: rates
// (per second, from counters) and gauges (the value at the sample, the sum
// of these fields).
const RATES = {put: "total_jobs", reserve: "total_jobs_reserved", delete: "total_jobs_deleted"};
const GAUGES = {ready: ["current_jobs_ready"], reserved: ["current_jobs_reserved"], delayed: ["current_jobs_delayed"],
  buried: ["current_jobs_buried"],
  connections: ["current_beanstalk_connections", "current_gearman_connections", "current_http_connections"]};

let points = [];          // {t: performance.now() ms, put, reserve, ..., connections}, oldest first
let last = null;          // the last poll: {t, counters of RATES}
let fetchedAt = -Infinity;
let stale = true;         // ask the server on the next ensure()

function trim(now) {
  while (points.length && now - points[0].t > CHART_SECONDS * 1000) points.shift();
}

// One poll's GET /stats: a point of rates since the poll before (none for
// the first, nor across a counter that went back: a restart).
export function record(stats) {
  const t = performance.now();
  if (last && t - last.t > GAP_MS) stale = true;
  if (last && t > last.t) {
    const p = {t};
    for (const [key, field] of Object.entries(RATES)) {
      const d = stats[field] - last[key];
      p[key] = d >= 0 ? d / ((t - last.t) / 1000) : 0;
    }
    for (const [key, fields] of Object.entries(GAUGES)) p[key] = fields.reduce((sum, f) => sum + stats[f], 0);
    points.push(p);
  }
  last = {t};
  for (const [key, field] of Object.entries(RATES)) last[key] = stats[field];
  trim(t);
}

// Make sure the points start from the server's history: ask for it when
// never asked, after a gap, or when the last answer is old.
export async function ensure() {
  const now = performance.now();
  if (!stale && now - fetchedAt < REFETCH_AFTER_MS) return;
  const doc = await api.get("stats/history");
  const at = performance.now();
  // the newest sample is `end`; the browser's clock may differ from the
  // server's, so the lag is taken as at most one interval
  const lag = Math.min(Math.max(Date.now() / 1000 - doc.end, 0), doc.interval) * 1000;
  const n = Math.max(0, ...Object.values(doc.series).map((a) => a.length));
  const fresh = [];
  for (let i = 0; i < n; i++) {
    const p = {t: at - lag - (n - 1 - i) * doc.interval * 1000};
    for (const [key, values] of Object.entries(doc.series)) p[key] = values[i - (n - values.length)] || 0;
    fresh.push(p);
  }
  const newest = fresh.length ? fresh[fresh.length - 1].t : -Infinity;
  points = fresh.concat(points.filter((p) => p.t > newest));
  fetchedAt = at;
  stale = false;
  trim(at);
}

// The points of the last 15 minutes, oldest first (read-only).
export const recent = () => points;
