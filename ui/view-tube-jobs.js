// view-tube-jobs.js - a tube's jobs of one state (ready, delayed, buried,
// reserved), a page at a time in the order the server serves them
// (GET /tubes/{tube}/jobs: cursor paging, so a page costs the server the
// same however many jobs the tube holds). Tabs by state with their counts,
// a page size, a "go to job" box, each job's body on demand (the body
// viewer), the job actions (kick, delete), and bulk actions on the whole
// state (kick all buried or delayed; delete all ready, delayed or buried)
// behind a confirmation that names the count. The tube's counts are polled;
// the page is asked again only when they moved, after an action, or every
// 5 s (for the ages and times left).

import {h, fill, setText} from "./dom.js";
import * as api from "./api.js";
import {count, duration} from "./format.js";
import {act, bodyViewer, confirmAction, notify} from "./widgets.js";

const STATES = ["ready", "delayed", "buried", "reserved"];
const SIZES = [20, 50, 100, 500];
const DEFAULT_SIZE = 50;
const REFETCH_MS = 5000;

// The bulk actions of each state: [verb, what the server is asked].
const BULK = {
  ready: [["Delete", "delete"]],
  delayed: [["Kick", "kick"], ["Delete", "delete"]],
  buried: [["Kick", "kick"], ["Delete", "delete"]],
  reserved: [],
};

// The table's columns: label, which states show it, the cell's text (or
// node) of a job; "num" right-aligns.
const COLUMNS = [
  {label: "Priority", num: true, text: (j) => count(j.priority)},
  {label: "Age", num: true, text: (j) => duration(j.age)},
  {label: "Time left", num: true, states: ["delayed", "reserved"], text: (j) => duration(j.time_left)},
  {label: "Reserved by", states: ["reserved"], client: true},
  {label: "Reserves", num: true, text: (j) => count(j.reserves)},
  {label: "Releases", num: true, text: (j) => count(j.releases)},
  {label: "Timeouts", num: true, text: (j) => count(j.timeouts)},
  {label: "Buries", num: true, text: (j) => count(j.buries)},
  {label: "Kicks", num: true, text: (j) => count(j.kicks)},
];

const plural = (n, one) => `${count(n)} ${n === 1 ? one : one + "s"}`;

export function tubeJobsView(main, {name, query}, app) {
  const path = api.tubePath(name);
  const view = {
    state: STATES.includes(query.get("state")) ? query.get("state") : "ready",
    limit: SIZES.includes(Number(query.get("limit"))) ? Number(query.get("limit")) : DEFAULT_SIZE,
  };
  let cursors = [""];      // the cursor of each page up to the one shown ("": the first)
  let next = null;         // the cursor of the page after it, or null at the end
  let counts = null;       // the tube's GET /tubes/{tube}, from the last poll
  let force = true, signature = "", fetchedAt = 0;
  const rows = new Map();  // job id -> its row (made once, updated in place)

  // tabs: one button a state, with its count
  const tabs = {};
  const tabBar = h("div", {class: "segmented tabs", role: "group", "aria-label": "Jobs in state"},
    STATES.map((st) => {
      tabs[st] = h("button", {type: "button", class: "seg", "data-state": st, "aria-pressed": "false",
        onclick: () => { view.state = st; changed(); }}, st);
      return tabs[st];
    }));

  const size = h("select", {id: "jobs-limit"}, SIZES.map((n) => h("option", {value: String(n)}, String(n))));
  size.value = String(view.limit);
  size.addEventListener("change", () => { view.limit = Number(size.value); changed(); });

  const goto = h("input", {id: "jobs-goto", type: "number", inputmode: "numeric", min: "1", step: "1",
    placeholder: "job id"});
  const gotoForm = h("form", {class: "inline-form", novalidate: true, "aria-label": "Go to a job"},
    h("label", {for: "jobs-goto"}, "Go to job"), goto, h("button", {type: "submit"}, "Open"));
  gotoForm.addEventListener("submit", (e) => {
    e.preventDefault();
    const id = goto.value.trim();
    if (!/^[1-9][0-9]*$/.test(id)) {
      goto.setAttribute("aria-invalid", "true");
      notify("Go to job: a job id is a whole number from 1", "error");
      return;
    }
    location.hash = `#/jobs/${id}`;
  });

  const bulkBar = h("div", {class: "buttons bulk", role: "group", "aria-label": "Bulk actions"});
  const reservedNote = h("p", {class: "muted", hidden: true},
    "A reserved job belongs to the client that reserved it: close that client (",
    h("a", {href: "#/clients"}, "Clients"), ") to put its jobs back to ready.");

  const headRow = h("tr");
  const caption = h("caption");
  const tbody = h("tbody");
  const table = h("table", {class: "tubes jobs"}, caption, h("thead", {}, headRow), tbody);
  const empty = h("p", {class: "muted", hidden: true});
  const missing = h("p", {class: "notice-inline", hidden: true},
    "There is no such tube now. A tube exists while it has jobs or clients that use or watch it.");
  const prev = h("button", {type: "button", onclick: () => { cursors.pop(); changed(true); }}, "Previous");
  const nextButton = h("button", {type: "button", onclick: () => { cursors.push(next); changed(true); }}, "Next");
  const pageInfo = h("span", {class: "page-info"});

  main.append(
    h("nav", {class: "crumbs", "aria-label": "Breadcrumb"}, h("a", {href: "#/tubes"}, "Tubes"), " › ",
      h("a", {href: api.tubeHref(name)}, name), " › ", h("span", {}, "Jobs")),
    h("h1", {}, "Jobs of tube ", h("span", {class: "name"}, name)),
    missing,
    tabBar,
    h("div", {class: "toolbar"}, h("label", {for: "jobs-limit"}, "Page size"), size, gotoForm),
    bulkBar, reservedNote,
    h("div", {class: "table-wrap", tabindex: "0", role: "region", "aria-label": "Jobs table"}, table),
    empty,
    h("nav", {class: "pager", "aria-label": "Pages of jobs"}, prev, pageInfo, nextButton),
  );

  // The state or the page size changed (keepPage: only the page did):
  // keep them in the address, start from the first page, fetch at once.
  function changed(keepPage) {
    if (!keepPage) cursors = [""];
    history.replaceState(null, "", api.tubeJobsHref(name, view.state) +
      (view.limit !== DEFAULT_SIZE ? "&limit=" + view.limit : ""));
    force = true;
    if (!keepPage) { rows.clear(); tbody.replaceChildren(); header(); }
    app.refreshNow();
  }

  const columns = () => COLUMNS.filter((c) => !c.states || c.states.includes(view.state));

  function header() {
    fill(headRow, h("th", {scope: "col"}, "Job"),
      columns().map((c) => h("th", {scope: "col", class: c.num ? "num" : ""}, c.label)),
      h("th", {scope: "col"}, "Actions"));
    for (const [st, tab] of Object.entries(tabs)) tab.setAttribute("aria-pressed", String(st === view.state));
    showBulk();
  }

  // The bulk buttons of the state, for a token that may manage the tube
  // (made again only when either changed: a focused button keeps focus).
  let bulkFor = "";
  function showBulk() {
    const manage = api.may("manage", name);
    if (bulkFor === view.state + manage) return;
    bulkFor = view.state + manage;
    bulkBar.replaceChildren(...(manage ? BULK[view.state] : []).map(([verb, op]) =>
      h("button", {type: "button", class: op === "delete" ? "danger" : "", "data-bulk": op,
        onclick: () => bulk(op)}, `${verb} all ${view.state}`)));
    bulkBar.hidden = !bulkBar.children.length;
    reservedNote.hidden = view.state !== "reserved";
  }

  // Kick or delete every job of the state, after a confirmation that names
  // how many: at most that many are done (jobs that came meanwhile stay),
  // and the answer's count is shown.
  async function bulk(op) {
    const st = view.state;
    const n = counts ? counts["current_jobs_" + st] : 0;
    if (!n) { notify(`Tube ${name} has no ${st} job.`, "ok"); return; }
    const question = op === "delete"
      ? `Delete ${plural(n, st + " job")} of tube ${name}? This cannot be undone.`
      : `Kick ${plural(n, st + " job")} of tube ${name}? They become ready.`;
    const verb = op === "delete" ? "Delete" : "Kick";
    if (!(await confirmAction(question, `${verb} ${plural(n, "job")}`))) return;
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

  // The row of job id: made once, with its body row (shown on demand).
  function row(id) {
    let r = rows.get(id);
    if (r) return r;
    const link = h("a", {href: `#/jobs/${id}`}, String(id));
    const cells = columns().map((c) => h("td", {class: c.num ? "num" : ""}));
    const show = h("button", {type: "button", class: "small", "aria-expanded": "false"}, "Body");
    const kick = h("button", {type: "button", class: "small"}, "Kick");
    const del = h("button", {type: "button", class: "small danger"}, "Delete");
    const tr = h("tr", {"data-id": String(id)}, h("th", {scope: "row"}, link), cells,
      h("td", {}, h("div", {class: "row-actions"}, show, kick, del)));
    const viewer = bodyViewer(`Body of job ${id}`);
    const bodyTr = h("tr", {class: "body-row", hidden: true},
      h("td", {colspan: String(cells.length + 2)}, viewer.node));
    r = {tr, bodyTr, cells, kick, del, job: null};
    show.addEventListener("click", async () => {
      const open = bodyTr.hidden;
      bodyTr.hidden = !open;
      show.setAttribute("aria-expanded", String(open));
      if (!open || r.haveBody) return;
      try {
        viewer.show(await api.call("GET", `jobs/${id}/body`, {raw: true}), id);
        r.haveBody = true;
      } catch (e) {
        notify(e.status === 404 ? `Job ${id} is gone.` : e.message, "error");
      }
    });
    kick.addEventListener("click", () => act(app, async () => {
      force = true;
      await api.post(`jobs/${id}/kick`);
      return `Job ${id} kicked: it is ready.`;
    }));
    del.addEventListener("click", async () => {
      if (!(await confirmAction(`Delete job ${id} of tube ${name}? This cannot be undone.`, "Delete job"))) return;
      act(app, async () => {
        force = true;
        await api.del(`jobs/${id}`);
        return `Job ${id} deleted.`;
      });
    });
    rows.set(id, r);
    return r;
  }

  function show(doc) {
    const manage = api.may("manage", name);
    const order = [];
    for (const j of doc.jobs) {
      const r = row(j.id);
      r.job = j;
      columns().forEach((c, k) => {
        if (!c.client) { setText(r.cells[k], c.text(j)); return; }
        const held = j.reserved_by;
        const link = r.cells[k].firstChild;
        if (held === undefined || held === null) setText(r.cells[k], held === null ? "an HTTP reservation" : "–");
        else if (!link || link.getAttribute("href") !== api.clientHref(held)) {
          r.cells[k].replaceChildren(h("a", {href: api.clientHref(held)}, `client ${held}`));
        }
      });
      r.kick.hidden = !manage || (j.state !== "buried" && j.state !== "delayed");
      r.del.hidden = !manage || j.state === "reserved";
      order.push(r.tr, r.bodyTr);
    }
    const ids = new Set(doc.jobs.map((j) => j.id));
    for (const id of rows.keys()) if (!ids.has(id)) rows.delete(id);
    // re-attach only when the rows changed (a focused button keeps its focus)
    const same = order.length === tbody.children.length && order.every((n, i) => tbody.children[i] === n);
    if (!same) tbody.replaceChildren(...order);

    next = doc.next;
    const page = cursors.length;
    const first = (page - 1) * view.limit + 1;
    setText(caption, doc.jobs.length
      ? `${view.state[0].toUpperCase()}${view.state.slice(1)} jobs ${count(first)}–${count(first + doc.jobs.length - 1)} of ${count(doc.count)}, in the order they are served`
      : `No ${view.state} jobs`);
    setText(pageInfo, `Page ${count(page)} of ${count(Math.max(1, Math.ceil(doc.count / view.limit)))}`);
    empty.hidden = doc.jobs.length > 0;
    setText(empty, `Tube ${name} has no ${view.state} job now.`);
    prev.disabled = page === 1;
    nextButton.disabled = !next;
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
        show({jobs: [], count: 0, next: null});
        return;
      }
      missing.hidden = true;
      for (const st of STATES) setText(tabs[st], `${st[0].toUpperCase()}${st.slice(1)} ${count(counts["current_jobs_" + st])}`);
      const sig = [counts.current_jobs_ready, counts.current_jobs_reserved, counts.current_jobs_delayed,
        counts.current_jobs_buried, counts.total_jobs, counts.cmd_delete].join();
      const now = performance.now();
      if (!force && sig === signature && now - fetchedAt < REFETCH_MS) return;
      force = false;
      signature = sig;
      fetchedAt = now;
      const doc = await api.get(`${path}/jobs`, {state: view.state, limit: view.limit, cursor: cursors[cursors.length - 1]});
      if (!doc.jobs.length && cursors.length > 1) {   // this page emptied: back to the first
        cursors = [""];
        force = true;
        return this.refresh();
      }
      show(doc);
    },
  };
}
