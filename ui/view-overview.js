// view-overview.js - the server at a glance: version and uptime,
// connections by protocol, the write-ahead log, jobs by state, and charts
// of the last 15 minutes: put, reserve and delete rates, jobs by state and
// connections. The facts come from GET /stats, which the app polls anyway;
// the charts from the server's history (history.js: GET /stats/history once,
// then extended by each GET /stats).

import {h, setText, setCounts, definitionList} from "./dom.js";
import {count, duration, bytes, ago, rate, number} from "./format.js";
import {chart, stateBar} from "./widgets.js";
import * as serverHistory from "./history.js";

function card(title, ...children) {
  return h("section", {class: "card", "aria-label": title}, h("h2", {}, title), ...children);
}

export function overviewView(main, params, app) {
  const server = definitionList([
    ["version", "Version"], ["uptime", "Uptime"], ["state", "State"],
    ["tubes", "Tubes"], ["max", "Largest job"],
  ]);
  const conns = definitionList([
    ["beanstalk", "Beanstalk"], ["gearman", "Gearman"], ["http", "HTTP"],
    ["producers", "Producers"], ["workers", "Workers"], ["waiting", "Waiting to reserve"],
  ]);
  const log = definitionList([
    ["enabled", "Enabled"], ["size", "Size on disk"], ["sync", "Last sync"], ["failed", "Writes failing"],
  ]);
  const jobs = definitionList([
    ["ready", "Ready"], ["reserved", "Reserved"], ["delayed", "Delayed"], ["buried", "Buried"],
    ["urgent", "Urgent (priority < 1024)"], ["total", "Put since start"], ["timeouts", "Reservations timed out"],
  ], "facts states");
  const tubesLink = h("a", {href: "#/tubes"}, "…");
  server.values.tubes.replaceChildren(tubesLink);
  const bar = stateBar();
  const rates = [
    chart("Puts", "jobs put per second", [{key: "put", label: "Puts"}]),
    chart("Reserves", "jobs reserved per second", [{key: "reserve", label: "Reserves"}]),
    chart("Deletes", "jobs deleted per second", [{key: "delete", label: "Deletes"}]),
  ];
  const gauges = [
    chart("Jobs by state", "jobs", [{key: "ready", label: "Ready", cls: "ready"},
      {key: "reserved", label: "Reserved", cls: "reserved"}, {key: "delayed", label: "Delayed", cls: "delayed"},
      {key: "buried", label: "Buried", cls: "buried"}]),
    chart("Connections", "connections", [{key: "connections", label: "Connections"}]),
  ];

  main.append(
    h("h1", {}, "Overview"),
    h("div", {class: "cards"},
      card("Server", server.dl),
      card("Connections", conns.dl),
      card("Write-ahead log", log.dl),
      card("Jobs", bar.node, jobs.dl),
      h("section", {class: "card wide", "aria-label": "Rates"},
        h("h2", {}, "Rates per second, last 15 minutes"),
        h("div", {class: "charts"}, rates.map((c) => c.node))),
      h("section", {class: "card wide", "aria-label": "History"},
        h("h2", {}, "Jobs and connections, last 15 minutes"),
        h("div", {class: "charts"}, gauges.map((c) => c.node))),
    ),
  );

  return {
    title: "Overview",
    async refresh(st) {
      const v = server.values;
      setText(v.version, st.version);
      setText(v.uptime, duration(st.uptime));
      setText(v.state, st.draining ? "Draining (SIGUSR1): puts are refused" : "Serving");
      v.state.className = st.draining ? "warn" : "";
      setText(tubesLink, count(st.current_tubes));
      setText(v.max, bytes(st.max_job_size));

      setCounts(conns.values, st, {
        beanstalk: "current_beanstalk_connections", gearman: "current_gearman_connections",
        http: "current_http_connections", producers: "current_producers", workers: "current_workers",
        waiting: "current_waiting",
      });

      const l = log.values;
      setText(l.enabled, st.binlog_enabled ? `Yes (segment ${st.binlog_current_index})` : "No: memory only");
      setText(l.size, st.binlog_enabled ? bytes(st.binlog_size) : "–");
      setText(l.sync, !st.binlog_enabled ? "–" : st.binlog_last_sync_age_ms === null ? "Never (-F)" : ago(st.binlog_last_sync_age_ms));
      setText(l.failed, st.binlog_failed ? "Yes: puts are refused until the disk takes writes" : "No");
      l.failed.className = st.binlog_failed ? "warn" : "";

      setCounts(jobs.values, st, {
        ready: "current_jobs_ready", reserved: "current_jobs_reserved", delayed: "current_jobs_delayed",
        buried: "current_jobs_buried", urgent: "current_jobs_urgent", total: "total_jobs", timeouts: "job_timeouts",
      });
      bar.update([st.current_jobs_ready, st.current_jobs_reserved, st.current_jobs_delayed, st.current_jobs_buried]);

      await serverHistory.ensure();
      const points = serverHistory.recent(), now = performance.now();
      for (const c of rates) c.update(points, now, rate);
      for (const c of gauges) c.update(points, now, number);
    },
  };
}
