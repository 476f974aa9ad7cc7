// view-clients.js - who is connected (GET /clients): every beanstalk and
// Gearman connection, HTTP long-poll and push subscription, 100 a page by
// cursor, optionally of one protocol: id, protocol, peer, age, idle, the
// tube used and watched, the jobs reserved (links to them), waiting or
// not. Close (a token that may manage every tube; after a confirmation)
// ends a connection and its reserved jobs go back to ready; a push
// subscription is the configuration's and has none. #/clients?client=N
// shows client N alone (a reserved job's view links there).

import {h, setText} from "./dom.js";
import * as api from "./api.js";
import {count, duration} from "./format.js";
import {act, confirmAction, cursorPager, placeRows} from "./widgets.js";

const PAGE = 100;
const PROTOCOLS = ["beanstalk", "gearman", "http", "push"];

// The columns after the id: label, `num` right-aligns, the cell's text
// (`jobs`: the reserved jobs' links).
const COLUMNS = [
  {label: "Protocol", text: (c) => c.protocol + (c.tls ? " (TLS)" : "") + (c.name ? ` ${c.name}` : "")},
  {label: "Peer", text: (c) => c.peer || "–"},
  {label: "Age", num: true, text: (c) => duration(c.age)},
  {label: "Idle", num: true, text: (c) => duration(c.idle)},
  {label: "Uses", text: (c) => c.use || "–"},
  {label: "Watching", text: (c) => (c.watching && c.watching.length ? c.watching.join(", ") : "–")},
  {label: "Reserved", jobs: true},
  {label: "Waiting", text: (c) => (!c.waiting ? "no" : c.waiting_for === null ? "yes" : `yes, for ${duration(c.waiting_for)}`)},
];

// "Close client 7 (beanstalk, 127.0.0.1:5000)? Its 2 reserved jobs go back to ready."
function closeQuestion(c) {
  const jobs = c.reserved === 1 ? "Its reserved job goes" : `Its ${count(c.reserved)} reserved jobs go`;
  return `Close client ${c.id} (${c.protocol}${c.peer ? ", " + c.peer : ""})? ` +
    (c.reserved ? `${jobs} back to ready.` : "It holds no reserved job.");
}

// The reserved cell: the count, then links to the first 20 jobs.
function jobsCell(td, c) {
  const ids = c.reserved_ids || [];
  const key = c.reserved + ":" + ids.join();
  if (td.dataset.key === key) return;
  td.dataset.key = key;
  const parts = [count(c.reserved), ids.length ? ": " : ""];
  ids.forEach((jid, i) => parts.push(i ? ", " : "", h("a", {href: `#/jobs/${jid}`}, String(jid))));
  if (c.reserved > ids.length && ids.length) parts.push(` and ${count(c.reserved - ids.length)} more`);
  td.replaceChildren(...parts);
}

export function clientsView(main, params, app) {
  const protocol = PROTOCOLS.includes(params.get("protocol")) ? params.get("protocol") : "";
  const wanted = /^[0-9]+$/.test(params.get("client") || "") ? Number(params.get("client")) : null;

  const filter = h("select", {id: "clients-protocol"},
    h("option", {value: ""}, "all"), PROTOCOLS.map((p) => h("option", {value: p}, p)));
  filter.value = protocol;
  filter.addEventListener("change", () => { location.hash = "#/clients" + (filter.value ? "?protocol=" + filter.value : ""); });

  const caption = h("caption", {}, "Clients");
  const tbody = h("tbody");
  const empty = h("p", {class: "muted", hidden: true});
  const pager = cursorPager("Pages of clients", () => app.refreshNow());
  pager.node.hidden = wanted !== null;

  main.append(
    h("h1", {}, wanted === null ? "Clients" : `Client ${wanted}`),
    h("p", {hidden: wanted === null}, h("a", {href: "#/clients"}, "Show every client")),
    h("div", {class: "toolbar", hidden: wanted !== null},
      h("label", {for: "clients-protocol"}, "Protocol"), filter,
      h("span", {class: "muted"}, "Beanstalk, Gearman and HTTP long-poll clients, and push subscriptions.")),
    h("div", {class: "table-wrap", tabindex: "0", role: "region", "aria-label": "Clients table"},
      h("table", {class: "tubes clients"}, caption,
        h("thead", {}, h("tr", {}, h("th", {scope: "col", class: "num"}, "Client"),
          COLUMNS.map((c) => h("th", {scope: "col", class: c.num ? "num" : ""}, c.label)), h("th", {scope: "col"}, "Actions"))),
        tbody)),
    empty, pager.node);

  // One row a client, made once and updated in place (focus stays).
  const rows = new Map();   // id -> {tr, cells, close, client}
  function row(id) {
    if (rows.has(id)) return rows.get(id);
    const cells = COLUMNS.map((c) => h("td", {class: c.num ? "num" : ""}));
    const close = h("button", {type: "button", class: "small danger"}, "Close");
    const r = {tr: h("tr", {"data-id": String(id)}, h("th", {scope: "row", class: "num"}, String(id)), cells, h("td", {}, close)),
      cells, close, client: null};
    close.addEventListener("click", async () => {
      if (!(await confirmAction(closeQuestion(r.client), "Close client"))) return;
      act(app, async () => {
        await api.del(`clients/${id}`);
        return `Client ${id} closed.`;
      });
    });
    rows.set(id, r);
    return r;
  }

  function show(clients, total) {
    const manage = api.may("manage", "*");
    placeRows(tbody, clients.map((c) => {
      const r = row(c.id);
      r.client = c;
      COLUMNS.forEach((col, k) => (col.jobs ? jobsCell(r.cells[k], c) : setText(r.cells[k], col.text(c))));
      r.close.hidden = !manage || c.protocol === "push";
      r.tr.className = c.waiting ? "waiting" : "";
      return r.tr;
    }));
    const ids = new Set(clients.map((c) => c.id));
    for (const id of rows.keys()) if (!ids.has(id)) rows.delete(id);
    const first = (pager.page() - 1) * PAGE + 1;
    setText(caption, wanted !== null ? `Client ${wanted}` : clients.length
      ? `Clients ${count(first)}–${count(first + clients.length - 1)} of ${count(total)}${protocol ? " " + protocol : ""}` : "Clients");
    setText(empty, wanted !== null ? `There is no client ${wanted} now: it closed, or never was.`
      : protocol ? `No ${protocol} client is connected.` : "No client is connected.");
    empty.hidden = clients.length > 0;
  }

  // GET /clients, or null for a token that may not see clients (said once).
  async function ask(query) {
    try {
      return await api.get("clients", query);
    } catch (e) {
      if (e.status !== 403) throw e;
      setText(empty, "This token may not see the clients: that needs read on every tube (read:*).");
      empty.hidden = false;
      return null;
    }
  }

  return {
    title: wanted === null ? "Clients" : `Client ${wanted}`,
    async refresh() {
      if (wanted !== null) {
        // the page of one client after id wanted - 1 (the cursor is the
        // last id shown: docs/http.md, "Who is connected")
        const doc = await ask({limit: 1, cursor: wanted > 1 ? String(wanted - 1) : undefined});
        return doc && show(doc.clients.filter((x) => x.id === wanted), doc.count);
      }
      const doc = await ask({limit: PAGE, cursor: pager.cursor(), protocol: protocol || undefined});
      if (!doc) return;
      if (!doc.clients.length && pager.page() > 1) {   // this page emptied: back to the first
        pager.reset();
        return this.refresh();
      }
      pager.show(doc.next, `Page ${count(pager.page())}`);
      show(doc.clients, doc.count);
    },
  };
}
