// view-tubes.js - every tube, a page at a time: GET /stats/tubes sorts,
// filters and cuts the page on the server, so the browser holds one page
// (100 rows) however many tubes there are. Put and delete rates are the
// server's, over its last 5 to 10 seconds (each tube's "rates"), so they show on
// the first poll.

import {h, setText} from "./dom.js";
import * as api from "./api.js";
import {count, rate} from "./format.js";

const PAGE = 100;

// The columns: label, the field shown, and the server's sort key (null:
// not sortable).
const COLUMNS = [
  {label: "Tube", sort: "name"},
  {label: "Ready", field: "current_jobs_ready", sort: "current_jobs_ready"},
  {label: "Reserved", field: "current_jobs_reserved", sort: "current_jobs_reserved"},
  {label: "Delayed", field: "current_jobs_delayed", sort: "current_jobs_delayed"},
  {label: "Buried", field: "current_jobs_buried", sort: "current_jobs_buried"},
  {label: "Waiting", field: "current_waiting", sort: "current_waiting"},
  {label: "Paused", sort: "pause_time_left"},
  {label: "Puts/s", sort: null},
  {label: "Deletes/s", sort: null},
];

export function tubesView(main, params, app) {
  const state = {
    filter: params.get("filter") || "",
    sort: COLUMNS.some((c) => c.sort && c.sort === params.get("sort")) ? params.get("sort") : "name",
    order: params.get("order") === "desc" ? "desc" : "asc",
    page: Math.max(0, parseInt(params.get("page") || "0", 10) || 0),
  };
  let total = 0;

  const filter = h("input", {id: "tube-filter", type: "search", value: state.filter, autocomplete: "off",
    spellcheck: "false", maxlength: "200", "aria-describedby": "filter-help"});
  let debounce = 0;
  filter.addEventListener("input", () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => { state.filter = filter.value.trim(); state.page = 0; changed(); }, 250);
  });

  const headers = COLUMNS.map((col) => {
    const th = h("th", {scope: "col", class: col.sort === "name" ? "" : "num"});
    if (col.sort) {
      th.append(h("button", {type: "button", class: "sort", onclick: () => sortBy(col.sort)}, col.label,
        h("span", {class: "arrow", "aria-hidden": "true"})));
    } else {
      th.append(col.label);
    }
    return {th, col};
  });
  const caption = h("caption", {}, "Tubes");
  const tbody = h("tbody");
  const table = h("table", {class: "tubes"}, caption, h("thead", {}, h("tr", {}, headers.map((x) => x.th))), tbody);
  const empty = h("p", {class: "muted", hidden: true}, "No tube matches.");
  const pageInfo = h("span", {class: "page-info"});
  const nav = {
    first: h("button", {type: "button", onclick: () => go(0)}, "First"),
    prev: h("button", {type: "button", onclick: () => go(state.page - 1)}, "Previous"),
    next: h("button", {type: "button", onclick: () => go(state.page + 1)}, "Next"),
    last: h("button", {type: "button", onclick: () => go(pages() - 1)}, "Last"),
  };

  main.append(
    h("h1", {}, "Tubes"),
    h("div", {class: "toolbar"},
      h("label", {for: "tube-filter"}, "Filter by name"), filter,
      h("span", {id: "filter-help", class: "muted"}, "Tubes whose name contains this text.")),
    h("div", {class: "table-wrap", tabindex: "0", role: "region", "aria-label": "Tubes table"}, table),
    empty,
    h("nav", {class: "pager", "aria-label": "Pages of tubes"}, nav.first, nav.prev, pageInfo, nav.next, nav.last),
  );

  function pages() { return Math.max(1, Math.ceil(total / PAGE)); }

  function go(page) {
    state.page = Math.min(Math.max(0, page), pages() - 1);
    changed();
  }

  function sortBy(key) {
    if (state.sort === key) state.order = state.order === "asc" ? "desc" : "asc";
    else { state.sort = key; state.order = key === "name" ? "asc" : "desc"; }
    state.page = 0;
    changed();
  }

  // Keep the table's state in the address (reload and back keep it) and
  // fetch the new page at once.
  function changed() {
    const q = new URLSearchParams();
    if (state.filter) q.set("filter", state.filter);
    if (state.sort !== "name" || state.order !== "asc") { q.set("sort", state.sort); q.set("order", state.order); }
    if (state.page) q.set("page", String(state.page));
    const qs = q.toString();
    history.replaceState(null, "", "#/tubes" + (qs ? "?" + qs : ""));
    app.refreshNow();
  }

  // One <tr> per row of the page, made once and then updated in place, so
  // that a focused link keeps its focus across polls.
  function row(i) {
    while (tbody.rows.length <= i) {
      const link = h("a", {href: "#/tubes"});
      const cells = COLUMNS.slice(1).map(() => h("td", {class: "num"}));
      tbody.append(h("tr", {}, h("th", {scope: "row"}, link), cells));
    }
    return tbody.rows[i];
  }

  function show(doc) {
    total = doc.total;
    doc.tubes.forEach((t, i) => {
      const tr = row(i);
      const link = tr.cells[0].firstChild;
      const href = api.tubeHref(t.name);
      if (link.getAttribute("href") !== href) link.setAttribute("href", href);
      setText(link, t.name);
      const values = [
        count(t.current_jobs_ready), count(t.current_jobs_reserved), count(t.current_jobs_delayed),
        count(t.current_jobs_buried), count(t.current_waiting),
        t.pause_time_left > 0 || t.pause > 0 ? `${count(t.pause_time_left)} s left` : "–",
        rate(t.rates.put), rate(t.rates.delete),
      ];
      values.forEach((v, k) => setText(tr.cells[k + 1], v));
      tr.className = t.pause_time_left > 0 ? "paused" : "";
    });
    while (tbody.rows.length > doc.tubes.length) tbody.lastChild.remove();

    const from = doc.tubes.length ? doc.offset + 1 : 0;
    setText(caption, doc.tubes.length
      ? `Tubes ${count(from)}–${count(doc.offset + doc.tubes.length)} of ${count(total)}${state.filter ? " matching the filter" : ""}`
      : "Tubes");
    setText(pageInfo, `Page ${count(state.page + 1)} of ${count(pages())}`);
    empty.hidden = doc.tubes.length > 0;
    nav.first.disabled = nav.prev.disabled = state.page === 0;
    nav.next.disabled = nav.last.disabled = state.page >= pages() - 1;
    for (const {th, col} of headers) {
      if (!col.sort) continue;
      const on = col.sort === state.sort;
      if (on) th.setAttribute("aria-sort", state.order === "asc" ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
      setText(th.querySelector(".arrow"), on ? (state.order === "asc" ? " ▲" : " ▼") : "");
    }
  }

  const NAME_CHARS = /^[A-Za-z0-9+\/;.$_()-]*$/;
  const help = main.querySelector("#filter-help");
  return {
    title: "Tubes",
    async refresh() {
      const valid = NAME_CHARS.test(state.filter);
      filter.setAttribute("aria-invalid", String(!valid));
      setText(help, valid ? "Tubes whose name contains this text."
        : "Tube names have only letters, digits and - + / ; . $ _ ( ): no tube matches this.");
      help.className = valid ? "muted" : "error-text";
      if (!valid) {
        show({total: 0, offset: 0, tubes: []});
        return;
      }
      const doc = await api.get("stats/tubes", {
        offset: state.page * PAGE, limit: PAGE, filter: state.filter || undefined,
        sort: state.sort, order: state.order,
      });
      if (!doc.tubes.length && doc.total > 0 && state.page > 0) {   // the last page went away
        state.page = Math.max(0, Math.ceil(doc.total / PAGE) - 1);
        return this.refresh();
      }
      show(doc);
    },
  };
}
