// view-tube-jobs.js - a tube's jobs of one state, a page at a time in the
// order the server serves them (GET /tubes/{tube}/jobs, by cursor: a page
// costs the same however many jobs the tube holds). Tabs by state with
// their counts, a page size, "go to job", each job's body on demand, kick
// and delete a job, and bulk kick or delete of the whole state behind a
// confirmation that names the count. The tube's counts are polled; the
// page is asked again only when they moved, after an action, or every 5 s.

import {h, fill, setText} from "./dom.js";
import * as api from "./api.js";
import {count, duration} from "./format.js";
import {act, bodyViewer, confirmAction, cursorPager, notify, placeRows, showHolder} from "./widgets.js";

const STATES = ["ready", "delayed", "buried", "reserved"];
const SIZES = [20, 50, 100, 500];
const DEFAULT_SIZE = 50;
const REFETCH_MS = 5000;
const BULK = {ready: ["delete"], delayed: ["kick", "delete"], buried: ["kick", "delete"], reserved: []};

// The columns after the job: label, the states that show it, the cell's
// text; `client`: the holder's link; `num` right-aligns.
const COLUMNS = [
  {label: "Priority", num: true, text: (j) => count(j.priority)},
  {label: "Age", num: true, text: (j) => duration(j.age)},
  {label: "Time left", num: true, states: ["delayed", "reserved"], text: (j) => duration(j.time_left)},
  {label: "Reserved by", states: ["reserved"], client: true},
  ...["reserves", "releases", "timeouts", "buries", "kicks"].map((k) =>
    ({label: k[0].toUpperCase() + k.slice(1), num: true, text: (j) => count(j[k])})),
];

const plural = (n, one) => `${count(n)} ${n === 1 ? one : one + "s"}`;
const title = (st) => st[0].toUpperCase() + st.slice(1);

export function tubeJobsView(main, {name, query}, app) {
  const path = api.tubePath(name);
  const view = {
    state: STATES.includes(query.get("state")) ? query.get("state") : "ready",
    limit: SIZES.includes(Number(query.get("limit"))) ? Number(query.get("limit")) : DEFAULT_SIZE,
  };
  let counts = null;       // the tube's GET /tubes/{tube}, from the last poll
  let force = true, signature = "", fetchedAt = 0;
  const rows = new Map();  // job id -> its row (made once, updated in place)
  const columns = () => COLUMNS.filter((c) => !c.states || c.states.includes(view.state));

  const tabs = {};
  const tabBar = h("div", {class: "segmented tabs", role: "group", "aria-label": "Jobs in state"},
    STATES.map((st) => (tabs[st] = h("button", {type: "button", class: "seg", "data-state": st,
      onclick: () => { view.state = st; changed(); }}, title(st)))));

  const size = h("select", {id: "jobs-limit"}, SIZES.map((n) => h("option", {value: String(n)}, String(n))));
  size.value = String(view.limit);
  size.addEventListener("change", () => { view.limit = Number(size.value); changed(); });

  const goto = h("input", {id: "jobs-goto", type: "number", inputmode: "numeric", min: "1", step: "1", placeholder: "job id"});
  const gotoForm = h("form", {class: "inline-form", novalidate: true, "aria-label": "Go to a job"},
    h("label", {for: "jobs-goto"}, "Go to job"), goto, h("button", {type: "submit"}, "Open"));
  gotoForm.addEventListener("submit", (e) => {
    e.preventDefault();
    const id = goto.value.trim();
    goto.setAttribute("aria-invalid", String(!/^[1-9][0-9]*$/.test(id)));
    if (goto.getAttribute("aria-invalid") === "true") notify("Go to job: a job id is a whole number from 1", "error");
    else location.hash = `#/jobs/${id}`;
  });

  const bulkBar = h("div", {class: "buttons bulk", role: "group", "aria-label": "Bulk actions"});
  const reservedNote = h("p", {class: "muted", hidden: true},
    "A reserved job belongs to the client that reserved it: close that client (",
    h("a", {href: "#/clients"}, "Clients"), ") to put its jobs back to ready.");
  const headRow = h("tr");
  const caption = h("caption");
  const tbody = h("tbody");
  const empty = h("p", {class: "muted", hidden: true});
  const missing = h("p", {class: "notice-inline", hidden: true},
    "There is no such tube now. A tube exists while it has jobs or clients that use or watch it.");
  const pager = cursorPager("Pages of jobs", () => changed(true));

  main.append(
    h("nav", {class: "crumbs", "aria-label": "Breadcrumb"}, h("a", {href: "#/tubes"}, "Tubes"), " › ",
      h("a", {href: api.tubeHref(name)}, name), " › ", h("span", {}, "Jobs")),
    h("h1", {}, "Jobs of tube ", h("span", {class: "name"}, name)),
    missing, tabBar,
    h("div", {class: "toolbar"}, h("label", {for: "jobs-limit"}, "Page size"), size, gotoForm),
    bulkBar, reservedNote,
    h("div", {class: "table-wrap", tabindex: "0", role: "region", "aria-label": "Jobs table"},
      h("table", {class: "tubes jobs"}, caption, h("thead", {}, headRow), tbody)),
    empty, pager.node);

  // The state or page size changed (keepPage: only the page did): keep
  // them in the address, start from the first page, fetch at once.
  function changed(keepPage) {
    history.replaceState(null, "", api.tubeJobsHref(name, view.state) +
      (view.limit !== DEFAULT_SIZE ? "&limit=" + view.limit : ""));
    if (!keepPage) {
      pager.reset();
      rows.clear();
      tbody.replaceChildren();
      header();
    }
    force = true;
    app.refreshNow();
  }

  function header() {
    fill(headRow, h("th", {scope: "col"}, "Job"),
      columns().map((c) => h("th", {scope: "col", class: c.num ? "num" : ""}, c.label)), h("th", {scope: "col"}, "Actions"));
    for (const st of STATES) tabs[st].setAttribute("aria-pressed", String(st === view.state));
    reservedNote.hidden = view.state !== "reserved";
  }

  // The bulk buttons of the state, for a token that may manage the tube
  // (made again only when either changed: a focused button keeps focus).
  let bulkFor = "";
  function showBulk() {
    const manage = api.may("manage", name);
    if (bulkFor === view.state + manage) return;
    bulkFor = view.state + manage;
    fill(bulkBar, (manage ? BULK[view.state] : []).map((op) =>
      h("button", {type: "button", class: op === "delete" ? "danger" : "", "data-bulk": op, onclick: () => bulk(op)},
        `${title(op)} all ${view.state}`)));
    bulkBar.hidden = !bulkBar.children.length;
  }

  // Kick or delete the state's jobs after a confirmation that names how
  // many: at most that many (jobs that came meanwhile stay); the answer's
  // count is shown.
  async function bulk(op) {
    const st = view.state;
    const n = counts ? counts["current_jobs_" + st] : 0;
    if (!n) return notify(`Tube ${name} has no ${st} job.`, "ok");
    const question = op === "delete" ? `Delete ${plural(n, st + " job")} of tube ${name}? This cannot be undone.`
      : `Kick ${plural(n, st + " job")} of tube ${name}? They become ready.`;
    if (!(await confirmAction(question, `${title(op)} ${plural(n, "job")}`))) return;
    act(app, async () => {
      force = true;
      if (op === "delete") {
        const r = await api.del(`${path}/jobs`, {state: st, bound: n});
        return `Deleted ${plural(r.deleted, st + " job")} of tube ${name}.`;
      }
      const r = await api.post(`${path}/kick`, {state: st, bound: n});
      return `Kicked ${plural(r.kicked, st + " job")} of tube ${name}: they are ready.`;
    });
  }

  // A job's action, then a fresh page.
  const jobAct = (work) => act(app, async () => { force = true; return work(); });

  // The row of job id, made once, with its body row (filled on demand).
  function row(id) {
    if (rows.has(id)) return rows.get(id);
    const cells = columns().map((c) => h("td", {class: c.num ? "num" : ""}));
    const show = h("button", {type: "button", class: "small", "aria-expanded": "false"}, "Body");
    const kick = h("button", {type: "button", class: "small"}, "Kick");
    const del = h("button", {type: "button", class: "small danger"}, "Delete");
    const tr = h("tr", {"data-id": String(id)}, h("th", {scope: "row"}, h("a", {href: `#/jobs/${id}`}, String(id))), cells,
      h("td", {}, h("div", {class: "row-actions"}, show, kick, del)));
    const viewer = bodyViewer(`Body of job ${id}`);
    const bodyTr = h("tr", {class: "body-row", hidden: true}, h("td", {colspan: String(cells.length + 2)}, viewer.node));
    const r = {tr, bodyTr, cells, kick, del, haveBody: false};
    show.addEventListener("click", async () => {
      bodyTr.hidden = !bodyTr.hidden;
      show.setAttribute("aria-expanded", String(!bodyTr.hidden));
      if (bodyTr.hidden || r.haveBody) return;
      try {
        viewer.show(await api.call("GET", `jobs/${id}/body`, {raw: true}), id);
        r.haveBody = true;
      } catch (e) {
        notify(e.status === 404 ? `Job ${id} is gone.` : e.message, "error");
      }
    });
    kick.addEventListener("click", () => jobAct(async () => {
      await api.post(`jobs/${id}/kick`);
      return `Job ${id} kicked: it is ready.`;
    }));
    del.addEventListener("click", async () => {
      if (!(await confirmAction(`Delete job ${id} of tube ${name}? This cannot be undone.`, "Delete job"))) return;
      jobAct(async () => {
        await api.del(`jobs/${id}`);
        return `Job ${id} deleted.`;
      });
    });
    rows.set(id, r);
    return r;
  }

  function show(doc) {
    const manage = api.may("manage", name);
    const nodes = [];
    for (const j of doc.jobs) {
      const r = row(j.id);
      columns().forEach((c, k) => (c.client ? showHolder(r.cells[k], j.reserved_by) : setText(r.cells[k], c.text(j))));
      r.kick.hidden = !manage || (j.state !== "buried" && j.state !== "delayed");
      r.del.hidden = !manage || j.state === "reserved";
      nodes.push(r.tr, r.bodyTr);
    }
    const ids = new Set(doc.jobs.map((j) => j.id));
    for (const id of rows.keys()) if (!ids.has(id)) rows.delete(id);
    placeRows(tbody, nodes);
    const first = (pager.page() - 1) * view.limit + 1;
    setText(caption, doc.jobs.length
      ? `${title(view.state)} jobs ${count(first)}–${count(first + doc.jobs.length - 1)} of ${count(doc.count)}, in the order they are served`
      : `No ${view.state} jobs`);
    pager.show(doc.next, `Page ${count(pager.page())} of ${count(Math.max(1, Math.ceil(doc.count / view.limit)))}`);
    empty.hidden = doc.jobs.length > 0;
    setText(empty, `Tube ${name} has no ${view.state} job now.`);
  }

  header();
  return {
    title: `Jobs of tube ${name}`,
    async refresh() {
      showBulk();
      try {
        counts = await api.get(path);
      } catch (e) {
        if (e.status !== 404) throw e;
        missing.hidden = false;
        counts = null;
        return show({jobs: [], count: 0, next: null});
      }
      missing.hidden = true;
      for (const st of STATES) setText(tabs[st], `${title(st)} ${count(counts["current_jobs_" + st])}`);
      const sig = [counts.current_jobs_ready, counts.current_jobs_reserved, counts.current_jobs_delayed,
        counts.current_jobs_buried, counts.total_jobs, counts.cmd_delete].join();
      const now = performance.now();
      if (!force && sig === signature && now - fetchedAt < REFETCH_MS) return;
      force = false;
      signature = sig;
      fetchedAt = now;
      const doc = await api.get(`${path}/jobs`, {state: view.state, limit: view.limit, cursor: pager.cursor()});
      if (!doc.jobs.length && pager.page() > 1) {   // this page emptied: back to the first
        pager.reset();
        force = true;
        return this.refresh();
      }
      show(doc);
    },
  };
}
