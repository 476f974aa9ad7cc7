// widgets.js - the pieces the views share: a job body viewer, a
// sparkline, a bar of job states, the confirmation dialog and the status
// message.

import {h, s, fill, setText} from "./dom.js";
import {bytes, count, duration, rate, preview, defaultMode} from "./format.js";

// ---- body viewer ------------------------------------------------------------

const MODES = [["text", "Text"], ["hex", "Hex"], ["json", "JSON"]];

// A job body with a choice of text, hex or pretty JSON. show(data, key)
// renders bytes; the mode the user chose stays while key (the job) is the
// same.
export function bodyViewer(label) {
  let data = null, key = null, mode = "text";
  const buttons = MODES.map(([m, text]) =>
    h("button", {type: "button", class: "seg", "aria-pressed": "false", "data-mode": m, onclick: () => choose(m)}, text));
  const size = h("span", {class: "muted body-size"});
  const note = h("p", {class: "note", hidden: true});
  const pre = h("pre", {class: "body", tabindex: "0", "aria-label": label});
  const node = h("div", {class: "body-viewer"},
    h("div", {class: "body-bar"}, h("div", {class: "segmented", role: "group", "aria-label": "Show the body as"}, buttons), size),
    note, pre);

  function render() {
    for (const b of buttons) b.setAttribute("aria-pressed", String(b.dataset.mode === mode));
    if (!data) return;
    const p = preview(data, mode);
    pre.className = mode === "hex" ? "body hex" : "body";
    setText(pre, p.text);
    setText(note, p.note);
    note.hidden = !p.note;
    setText(size, data.length === 1 ? "1 byte" : (data.length < 1024 ? count(data.length) + " bytes" : bytes(data.length)));
  }
  function choose(m) {
    mode = m;
    render();
  }
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

// ---- sparkline ----------------------------------------------------------------

const SPARK_W = 300, SPARK_H = 48;

// A line of the last values (one per poll), with the current value and
// the peak in text. update(values, seconds): values oldest first, over
// that many seconds.
export function sparkline(title) {
  const line = s("polyline", {class: "spark-line", points: ""});
  const area = s("polygon", {class: "spark-area", points: ""});
  const svg = s("svg", {class: "spark", viewBox: `0 0 ${SPARK_W} ${SPARK_H}`, preserveAspectRatio: "none", "aria-hidden": "true", focusable: "false"},
    s("line", {class: "spark-base", x1: 0, y1: SPARK_H - 0.5, x2: SPARK_W, y2: SPARK_H - 0.5}), area, line);
  const now = h("span", {class: "spark-now"}, "…");
  const peak = h("span", {class: "muted"});
  const node = h("figure", {class: "spark-box"},
    h("figcaption", {}, h("span", {class: "spark-title"}, title), " ", now), svg, peak);
  return {
    node,
    update(values, seconds) {
      const last = values.length ? values[values.length - 1] : 0;
      const max = Math.max(0, ...values);
      setText(now, rate(last));
      setText(peak, `peak ${rate(max)} over the last ${duration(seconds)}`);
      const top = max > 0 ? max : 1;
      const step = SPARK_W / Math.max(1, values.length - 1);
      const pts = values.map((v, i) => `${(i * step).toFixed(1)},${(SPARK_H - 2 - (v / top) * (SPARK_H - 6)).toFixed(1)}`);
      line.setAttribute("points", pts.join(" "));
      area.setAttribute("points", pts.length ? `0,${SPARK_H} ${pts.join(" ")} ${((values.length - 1) * step).toFixed(1)},${SPARK_H}` : "");
      node.setAttribute("aria-label", `${title}: ${rate(last)} now, peak ${rate(max)}`);
    },
  };
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

// A short message in the status line (announced by screen readers; the
// same message again, as a failing poll gives every second, is left alone).
export function notify(message, kind) {
  const box = document.getElementById("notice");
  const className = "notice " + (kind || "ok");
  if (box.className === className && box.textContent === message) return;
  box.className = className;
  fill(box, message);
}
