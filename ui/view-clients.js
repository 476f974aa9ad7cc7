// view-clients.js - who is connected: every beanstalk, Gearman and HTTP
// long-poll client and push subscription (GET /clients), a page at a time
// by cursor, optionally of one protocol. A row: the client's id,
// protocol, peer, age, idle time, the tube it uses, the tubes it watches,
// the jobs it holds reserved (links to their job pages) and whether it
// waits in a reserve. Close ends a client's connection (a token that may
// manage every tube; after a confirmation): its reserved jobs go back to
// ready; a push subscription is the configuration's and has no Close.
// #/clients?client=N shows client N (the job view links there).

import {h, setText} from "./dom.js";
import * as api from "./api.js";
import {count, duration} from "./format.js";
import {act, confirmAction} from "./widgets.js";

const PAGE = 100;
const PROTOCOLS = ["beanstalk", "gearman", "http", "push"];

// The columns after the id: label, "num" right-aligns, the cell of a client.
const COLUMNS = [
  {label: "Protocol", text: (c) => c.protocol + (c.tls ? " (TLS)" : "") + (c.name ? ` ${c.name}` : "")},
  {label: "Peer", text: (c) => c.peer || "–"},
  {label: "Age", num: true, text: (c) => duration(c.age)},
  {label: "Idle", num: true, text: (c) => duration(c.idle)},
  {label: "Uses", text: (c) => c.use || "–"},
  {label: "Watching", text: (c) => (c.watching && c.watching.length ? c.watching.join(", ") : "–")},
  {label: "Reserved", jobs: true},
  {label: "Waiting", text: (c) => (c.waiting ? (c.waiting_for === null ? "yes" : `yes, for ${duration(c.waiting_for)}`) : "no")},
];

// "Close client 7 (beanstalk, 127.0.0.1:5000)? Its 2 reserved jobs go back to ready."
function closeQuestion(c) {
  const jobs = c.reserved === 1 ? "Its reserved job goes" : `Its ${count(c.reserved)} reserved jobs go`;
  return `Close client ${c.id} (${c.protocol}${c.peer ? ", " + c.peer : ""})? ` +
    (c.reserved ? `${jobs} back to ready.` : "It holds no reserved job.");
}

export function clientsView(main, params, app) {
  const protocol = PROTOCOLS.includes(params.get("protocol")) ? params.get("protocol") : "";
  const wanted = /^[0-9]+$/.test(params.get("client") || "") ? Number(params.get("client")) : null;
  let cursors = [""], next = null;

  const filter = h("select", {id: "clients-protocol"},
    h("option", {value: ""}, "all"), PROTOCOLS.map((p) => h("option", {value: p}, p)));
  filter.value = protocol;
  filter.addEventListener("change", () => {
    location.hash = "#/clients" + (filter.value ? "?protocol=" + filter.value : "");
  });

  const caption = h("caption", {}, "Clients");
  const tbody = h("tbody");
  const table = h("table", {class: "tubes clients"}, caption,
    h("thead", {}, h("tr", {}, h("th", {scope: "col", class: "num"}, "Client"),
      COLUMNS.map((c) => h("th", {scope: "col", class: c.num ? "num" : ""}, c.label)),
      h("th", {scope: "col"}, "Actions"))),
    tbody);
  const empty = h("p", {class: "muted", hidden: true});
  const prev = h("button", {type: "button", onclick: () => { cursors.pop(); app.refreshNow(); }}, "Previous");
  const nextButton = h("button", {type: "button", onclick: () => { cursors.push(next); app.refreshNow(); }}, "Next");
  const pageInfo = h("span", {class: "page-info"});
  const all = h("p", {hidden: wanted === null}, h("a", {href: "#/clients"}, "Show every client"));

  main.append(
    h("h1", {}, wanted === null ? "Clients" : `Client ${wanted}`),
    all,
    h("div", {class: "toolbar", hidden: wanted !== null},
      h("label", {for: "clients-protocol"}, "Protocol"), filter,
      h("span", {class: "muted"}, "Beanstalk, Gearman and HTTP long-poll clients, and push subscriptions.")),
    h("div", {class: "table-wrap", tabindex: "0", role: "region", "aria-label": "Clients table"}, table),
    empty,
    h("nav", {class: "pager", "aria-label": "Pages of clients", hidden: wanted !== null}, prev, pageInfo, nextButton),
  );

  // One row a client, made once and updated in place (focus stays).
  const rows = new Map();   // id -> {tr, cells, close, client}
  function row(id) {
    let r = rows.get(id);
    if (r) return r;
    const cells = COLUMNS.map((c) => h("td", {class: c.num ? "num" : ""}));
    const close = h("button", {type: "button", class: "small danger"}, "Close");
    const tr = h("tr", {"data-id": String(id)}, h("th", {scope: "row", class: "num"}, String(id)), cells,
      h("td", {}, close));
    r = {tr, cells, close, client: null};
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

  // The reserved cell: the count, then links to up to 20 of its jobs.
  function jobsCell(td, c) {
    const key = c.reserved + ":" + (c.reserved_ids || []).join();
    if (td.dataset.key === key) return;
    td.dataset.key = key;
    const ids = c.reserved_ids || [];
    const parts = [count(c.reserved)];
    if (ids.length) {
      parts.push(": ");
      ids.forEach((jid, i) => parts.push(i ? ", " : "", h("a", {href: `#/jobs/${jid}`}, String(jid))));
      if (c.reserved > ids.length) parts.push(` and ${count(c.reserved - ids.length)} more`);
    }
    td.replaceChildren(...parts);
  }

  function show(clients, total) {
    const manage = api.may("manage", "*");
    const order = clients.map((c) => {
      const r = row(c.id);
      r.client = c;
      COLUMNS.forEach((col, k) => (col.jobs ? jobsCell(r.cells[k], c) : setText(r.cells[k], col.text(c))));
      r.close.hidden = !manage || c.protocol === "push";
      r.tr.className = c.waiting ? "waiting" : "";
      return r.tr;
    });
    const ids = new Set(clients.map((c) => c.id));
    for (const id of rows.keys()) if (!ids.has(id)) rows.delete(id);
    const same = order.length === tbody.children.length && order.every((n, i) => tbody.children[i] === n);
    if (!same) tbody.replaceChildren(...order);
    const first = (cursors.length - 1) * PAGE + 1;
    if (wanted !== null) {
      setText(caption, clients.length ? `Client ${wanted}` : "Clients");
      setText(empty, `There is no client ${wanted} now: it closed, or never was.`);
    } else {
      setText(caption, clients.length
        ? `Clients ${count(first)}–${count(first + clients.length - 1)} of ${count(total)}${protocol ? " " + protocol : ""}`
        : "Clients");
      setText(empty, protocol ? `No ${protocol} client is connected.` : "No client is connected.");
    }
    empty.hidden = clients.length > 0;
    setText(pageInfo, `Page ${count(cursors.length)}`);
    prev.disabled = cursors.length === 1;
    nextButton.disabled = !next;
  }

  // Client `wanted`, or none: the page of one client after id wanted - 1
  // (the cursor is the last id shown, docs/http.md "Who is connected").
  async function find() {
    const doc = await api.get("clients", {limit: 1, cursor: wanted > 1 ? String(wanted - 1) : undefined});
    return {clients: doc.clients.filter((x) => x.id === wanted), count: doc.count};
  }

  return {
    title: wanted === null ? "Clients" : `Client ${wanted}`,
    async refresh() {
      if (wanted !== null) {
        const doc = await find();
        next = null;
        show(doc.clients, doc.count);
        return;
      }
      const doc = await api.get("clients", {limit: PAGE, cursor: cursors[cursors.length - 1], protocol: protocol || undefined});
      if (!doc.clients.length && cursors.length > 1) {   // this page emptied: back to the first
        cursors = [""];
        return this.refresh();
      }
      next = doc.next;
      show(doc.clients, doc.count);
    },
  };
}
