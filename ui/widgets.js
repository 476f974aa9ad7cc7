// widgets.js - the pieces the views share: a job body viewer, a
// chart with axes, a bar of job states, the confirmation dialog and the status
// message.

import {h, s, fill, setText} from "./dom.js";
import {clientHref} from "./api.js";
import {bytes, count, preview, defaultMode, hexLineChars} from "./format.js";

// ---- body viewer ------------------------------------------------------------

const MODES = [["text", "Text"], ["hex", "Hex"], ["json", "JSON"]];
const HEX_ROWS = [16, 8, 4];   // bytes per hex line, the widest that fits first

// A job body with a choice of text, hex or pretty JSON. show(data, key)
// renders bytes; the mode the user chose stays while key (the job) is the
// same. The hex dump has as many bytes a line as its box fits (16, 8 or
// 4), so it wraps to the box rather than running out of it.
export function bodyViewer(label) {
  let data = null, key = null, mode = "text", perRow = 16;
  const buttons = MODES.map(([m, text]) =>
    h("button", {type: "button", class: "seg", "aria-pressed": "false", "data-mode": m, onclick: () => choose(m)}, text));
  const size = h("span", {class: "muted body-size"});
  const note = h("p", {class: "note", hidden: true});
  const pre = h("pre", {class: "body", tabindex: "0", "aria-label": label});
  const ruler = h("span", {class: "body-ruler", "aria-hidden": "true"}, "0123456789");   // ten characters' width
  const node = h("div", {class: "body-viewer"},
    h("div", {class: "body-bar"}, h("div", {class: "segmented", role: "group", "aria-label": "Show the body as"}, buttons), size),
    note, pre, ruler);

  // The bytes a hex line may hold in the box as it is now.
  function fittingRow() {
    const charWidth = ruler.getBoundingClientRect().width / 10;
    const cs = getComputedStyle(pre);
    const room = pre.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    if (!charWidth || room <= 0) return perRow;   // not laid out (hidden): keep what it was
    return HEX_ROWS.find((n) => hexLineChars(n) * charWidth <= room) || HEX_ROWS[HEX_ROWS.length - 1];
  }
  function render() {
    for (const b of buttons) b.setAttribute("aria-pressed", String(b.dataset.mode === mode));
    if (!data) return;
    perRow = fittingRow();
    const p = preview(data, mode, perRow);
    pre.className = mode === "hex" ? "body hex" : "body";
    pre.dataset.perRow = String(perRow);
    setText(pre, p.text);
    setText(note, p.note);
    note.hidden = !p.note;
    setText(size, data.length === 1 ? "1 byte" : (data.length < 1024 ? count(data.length) + " bytes" : bytes(data.length)));
  }
  function choose(m) {
    mode = m;
    render();
  }
  new ResizeObserver(() => {
    if (data && mode === "hex" && fittingRow() !== perRow) render();
  }).observe(pre);
  return {
    node,
    show(newData, newKey) {
      if (newKey !== key) mode = defaultMode(newData);
      key = newKey;
      data = newData;
      render();
    },
  };
}

// ---- charts ----------------------------------------------------------------------

const CHART_W = 900, CHART_H = 120;
export const CHART_SECONDS = 900;   // the time a chart spans: the server's history (15 minutes)
const X_TICKS = [15, 10, 5, 0];     // minutes ago, left to right

// The smallest of 1, 2, 5 times a power of ten at or above v (the axis' top).
function niceCeiling(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  return [1, 2, 5, 10].map((m) => m * p).find((x) => x >= v);
}

// A chart of the last 15 minutes with its axes: x in minutes ago (15 to
// now), y from 0 to a round maximum in `unit` ("per second", "jobs"),
// labelled. lines: [{key, label, cls}], one polyline each (the first with
// an area under it when it is the only one). update(points, nowMs, fmt):
// points are {t: ms on performance.now()'s clock, [key]: value}, oldest
// first; fmt formats a value (the current one and the axis labels).
export function chart(title, unit, lines) {
  const grid = X_TICKS.map((m) => {
    const x = CHART_W - (m * 60 / CHART_SECONDS) * CHART_W;
    return s("line", {class: "chart-grid", x1: x, y1: 0, x2: x, y2: CHART_H});
  });
  const half = s("line", {class: "chart-grid", x1: 0, y1: CHART_H / 2, x2: CHART_W, y2: CHART_H / 2});
  const area = s("polygon", {class: "chart-area", points: ""});
  const polys = lines.map((l) => s("polyline", {class: "chart-line " + (l.cls || ""), points: ""}));
  const svg = s("svg", {class: "chart", viewBox: `0 0 ${CHART_W} ${CHART_H}`, preserveAspectRatio: "none",
    "aria-hidden": "true", focusable: "false"},
  grid, half, s("line", {class: "chart-base", x1: 0, y1: CHART_H - 0.5, x2: CHART_W, y2: CHART_H - 0.5}),
  lines.length === 1 ? area : null, polys);
  const yMax = h("span", {class: "chart-ymax"}, "…");
  const yHalf = h("span", {class: "chart-yhalf"});
  const now = h("span", {class: "chart-now"}, "…");
  const legend = lines.length > 1
    ? h("ul", {class: "chart-legend"}, lines.map((l) => h("li", {class: l.cls}, l.label))) : null;
  const node = h("figure", {class: "chart-box"},
    h("figcaption", {}, h("span", {class: "chart-title"}, title), " ", now),
    h("div", {class: "chart-plot"},
      h("div", {class: "chart-y"}, yMax, yHalf, h("span", {}, "0")),
      svg),
    h("div", {class: "chart-x"}, X_TICKS.map((m) => h("span", {}, m === 0 ? "now" : m === 15 ? "15 min ago" : `${m} min`))),
    h("p", {class: "chart-unit muted"}, `y: ${unit}; x: minutes ago`),
    legend);
  return {
    node,
    update(points, nowMs, fmt) {
      const shown = points.filter((p) => nowMs - p.t <= CHART_SECONDS * 1000);
      let max = 0;
      for (const p of shown) for (const l of lines) max = Math.max(max, p[l.key] || 0);
      const top = niceCeiling(max);
      setText(yMax, fmt(top));
      setText(yHalf, fmt(top / 2));
      const xy = (p, key) => {
        const x = CHART_W - ((nowMs - p.t) / 1000 / CHART_SECONDS) * CHART_W;
        const y = CHART_H - 1 - ((p[key] || 0) / top) * (CHART_H - 4);
        return `${x.toFixed(1)},${y.toFixed(1)}`;
      };
      lines.forEach((l, i) => polys[i].setAttribute("points", shown.map((p) => xy(p, l.key)).join(" ")));
      if (lines.length === 1 && shown.length) {
        const first = xy(shown[0], lines[0].key).split(",")[0], last = xy(shown[shown.length - 1], lines[0].key).split(",")[0];
        area.setAttribute("points", `${first},${CHART_H} ${polys[0].getAttribute("points")} ${last},${CHART_H}`);
      } else {
        area.setAttribute("points", "");
      }
      const latest = shown.length ? shown[shown.length - 1] : null;
      const current = lines.map((l) => (lines.length > 1 ? l.label + " " : "") + fmt(latest ? latest[l.key] || 0 : 0)).join(", ");
      setText(now, latest ? current : "no data yet");
      node.setAttribute("aria-label", `${title}: ${latest ? current : "no data yet"} now; axis top ${fmt(top)} (${unit}) over the last 15 minutes`);
      node.dataset.max = String(max);
    },
  };
}

// ---- cursor pages ------------------------------------------------------------

// Previous and Next over pages asked for by cursor: the cursors of the
// pages come through ("" is the first) make Previous. onChange() runs after
// a move. show(next, text): the page's `next` (null at the end) and what
// the pager says.
export function cursorPager(label, onChange) {
  let cursors = [""], next = null;
  const info = h("span", {class: "page-info"});
  const prev = h("button", {type: "button", onclick: () => { cursors.pop(); onChange(); }}, "Previous");
  const forward = h("button", {type: "button", onclick: () => { cursors.push(next); onChange(); }}, "Next");
  return {
    node: h("nav", {class: "pager", "aria-label": label}, prev, info, forward),
    cursor: () => cursors[cursors.length - 1],
    page: () => cursors.length,
    reset() { cursors = [""]; },
    show(nextCursor, text) {
      next = nextCursor;
      setText(info, text);
      prev.disabled = cursors.length === 1;
      forward.disabled = !next;
    },
  };
}

// Make tbody's rows these nodes, in order, moving them only when they
// differ (a focused button keeps its focus across polls).
export function placeRows(tbody, nodes) {
  if (nodes.length !== tbody.children.length || nodes.some((n, i) => tbody.children[i] !== n)) tbody.replaceChildren(...nodes);
}

// Who holds a reserved job, into node: "client 7" linked to it in the
// Clients view; "an HTTP reservation" for null (a reservation token holds
// it, no client); "–" for undefined (not reserved).
export function showHolder(node, client) {
  if (client === null || client === undefined) return setText(node, client === null ? "an HTTP reservation" : "–");
  const link = node.firstElementChild;
  if (link && link.getAttribute("href") === clientHref(client)) return;
  node.replaceChildren(h("a", {href: clientHref(client)}, `client ${client}`));
}

// ---- a bar of job states ----------------------------------------------------------

// Four segments (ready, reserved, delayed, buried), widths by share.
export function stateBar() {
  const states = ["ready", "reserved", "delayed", "buried"];
  const rects = states.map((st) => s("rect", {class: "bar-" + st, x: 0, y: 0, width: 0, height: 12}));
  const node = s("svg", {class: "state-bar", viewBox: "0 0 1000 12", preserveAspectRatio: "none", "aria-hidden": "true", focusable: "false"},
    s("rect", {class: "bar-empty", x: 0, y: 0, width: 1000, height: 12}), rects);
  return {
    node,
    update(values) {
      const total = values.reduce((a, b) => a + b, 0);
      let x = 0;
      values.forEach((v, i) => {
        const w = total ? (v / total) * 1000 : 0;
        rects[i].setAttribute("x", x.toFixed(1));
        rects[i].setAttribute("width", w.toFixed(1));
        x += w;
      });
    },
  };
}

// ---- dialogs and messages -------------------------------------------------------------

// Ask before a destructive action: resolves true for the confirming button,
// false for Cancel or Escape. Focus goes back to where it was.
export function confirmAction(message, okLabel) {
  const dialog = document.getElementById("confirm-dialog");
  const ok = document.getElementById("confirm-ok");
  const cancel = document.getElementById("confirm-cancel");
  setText(document.getElementById("confirm-msg"), message);
  setText(ok, okLabel);
  const back = document.activeElement;
  return new Promise((resolve) => {
    let answer = false;
    const onOk = () => { answer = true; dialog.close(); };
    const onCancel = () => dialog.close();
    // Escape closes the dialog too: every way out ends here
    const onClose = () => {
      dialog.removeEventListener("close", onClose);
      ok.removeEventListener("click", onOk);
      cancel.removeEventListener("click", onCancel);
      if (back && back.isConnected) back.focus();
      resolve(answer);
    };
    dialog.addEventListener("close", onClose);
    ok.addEventListener("click", onOk);
    cancel.addEventListener("click", onCancel);
    dialog.showModal();
    cancel.focus();
  });
}

// Run an action (an async function that returns its message); the message
// or the error goes to the status line. Then refresh the view at once.
export async function act(app, work) {
  try {
    notify(await work(), "ok");
  } catch (e) {
    notify(e.message || String(e), "error");
  }
  app.refreshNow();
}

// A short message in the status line (announced by screen readers; the
// same message again, as a failing poll gives every second, is left alone).
export function notify(message, kind) {
  const box = document.getElementById("notice");
  const className = "notice " + (kind || "ok");
  if (box.className === className && box.textContent === message) return;
  box.className = className;
  fill(box, message);
}
