// view-subscriptions.js - push delivery's subscriptions (--push), one card
// each: where its tube's jobs go and how (concurrency, rate, timeout,
// attempts, backoff, signed), what is under way (in flight, backing off),
// the counters since the start, by failure reason too, and the last
// failure with a link to its job. Everything comes from `subscriptions` in
// GET /stats, which the app polls anyway: this view asks for nothing more.

import {h, setText, setCounts, definitionList} from "./dom.js";
import * as api from "./api.js";
import {count, duration, deliveryError} from "./format.js";

const COUNTS = [
  ["in_flight", "In flight"], ["backing_off", "Backing off"], ["delivered", "Delivered"],
  ["retried", "Retried"], ["buried", "Buried"], ["attempts_started", "Attempts started"],
  ["reservations_lost", "Reservations lost"],
];
const SETTINGS = [
  ["concurrency", "Concurrency"], ["rate", "Rate"], ["timeout", "Timeout"],
  ["attempts", "Attempts before burying"], ["backoff", "Backoff"], ["signed", "Signed"],
];

// "http_5xx 3, timeout 1", or "none": the reasons that counted.
function reasons(byReason) {
  const parts = Object.entries(byReason || {}).filter(([, n]) => n > 0).map(([r, n]) => `${r} ${count(n)}`);
  return parts.length ? parts.join(", ") : "none";
}

// One subscription's card, made once and updated in place (a focused link
// keeps its focus across polls).
function subscriptionCard(tube) {
  const tubeLink = h("a", {href: api.tubeHref(tube)}, tube);
  const url = h("p", {class: "url name"});
  const counts = definitionList(COUNTS, "facts");
  const settings = definitionList(SETTINGS, "facts compact");
  const retriedBy = h("p", {class: "reasons", "data-key": "retried_by_reason"});
  const buriedBy = h("p", {class: "reasons", "data-key": "buried_by_reason"});
  const jobLink = h("a", {href: "#/subscriptions"});
  const lastText = h("span", {"data-key": "last_error_text"});
  const last = h("p", {class: "last-error", "data-key": "last_error"});
  const node = h("section", {class: "card subscription", "aria-label": "Subscription " + tube},
    h("h2", {}, "Tube ", tubeLink), url,
    counts.dl,
    h("h3", {}, "Retried by reason"), retriedBy,
    h("h3", {}, "Buried by reason"), buriedBy,
    h("h3", {}, "Last failure"), last,
    h("h3", {}, "Settings"), settings.dl);
  return {
    node,
    show(sub) {
      setText(url, sub.url);
      setCounts(counts.values, sub, Object.fromEntries(COUNTS.map(([key]) => [key, key])));
      setText(counts.values.in_flight, `${count(sub.in_flight)} of ${count(sub.concurrency)}`);
      counts.values.reservations_lost.className = sub.reservations_lost > 0 ? "warn" : "";
      setText(retriedBy, reasons(sub.retried_by_reason));
      setText(buriedBy, reasons(sub.buried_by_reason));
      const e = sub.last_error;
      if (e) {
        jobLink.setAttribute("href", `#/jobs/${e.job_id}`);
        setText(jobLink, `Job ${e.job_id}`);
        setText(lastText, ": " + deliveryError(e));
        if (!last.contains(jobLink)) last.replaceChildren(jobLink, lastText);
      } else if (last.textContent !== "None since the start.") {
        last.replaceChildren("None since the start.");
      }
      const v = settings.values;
      setText(v.concurrency, count(sub.concurrency));
      setText(v.rate, sub.rate === null ? "no limit" : sub.rate);
      setText(v.timeout, duration(sub.timeout));
      setText(v.attempts, count(sub.attempts));
      setText(v.backoff, `${duration(sub.backoff_min)} to ${duration(sub.backoff_max)}`);
      setText(v.signed, sub.signed ? "Yes (HMAC-SHA256)" : "No");
    },
  };
}

export function subscriptionsView(main, params, app) {
  const summary = h("p", {class: "muted"}, "…");
  const empty = h("section", {class: "card", "aria-label": "No subscription", hidden: true},
    h("h2", {}, "No subscription"),
    h("p", {}, "This server delivers no tube by push. Started with ",
      h("code", {}, "--push 'tube=T url=http://HOST:PORT/PATH'"),
      ", beangate POSTs each job of tube T to your service and retries with backoff until it answers 2xx " +
      "(docs/http.md, \"Push delivery\")."));
  const list = h("div", {class: "cards"});
  main.append(h("h1", {}, "Subscriptions"), summary, empty, list);
  const cards = new Map();   // tube -> card

  return {
    title: "Subscriptions",
    refresh(stats) {
      const subs = stats.subscriptions || [];
      const seen = new Set();
      subs.forEach((sub, i) => {
        let card = cards.get(sub.tube);
        if (!card) cards.set(sub.tube, card = subscriptionCard(sub.tube));
        if (list.children[i] !== card.node) list.insertBefore(card.node, list.children[i] || null);
        card.show(sub);
        seen.add(sub.tube);
      });
      for (const [tube, card] of cards) {
        if (!seen.has(tube)) { card.node.remove(); cards.delete(tube); }
      }
      empty.hidden = subs.length > 0;
      const inFlight = subs.reduce((n, s) => n + s.in_flight, 0);
      const backingOff = subs.reduce((n, s) => n + s.backing_off, 0);
      setText(summary, subs.length
        ? `${count(subs.length)} ${subs.length === 1 ? "subscription" : "subscriptions"}: ` +
          `${count(inFlight)} in flight, ${count(backingOff)} backing off.`
        : "No push subscription.");
    },
  };
}
