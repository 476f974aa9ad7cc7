// app.js - the dashboard: navigation, the views, the poll loop and the
// token prompt.
//
// One loop asks the server for GET /stats (and, for a scoped token, GET
// /auth: what it may do; the views hide the actions outside its scope),
// then lets the view on screen fetch what it shows, once per interval (1 s; never two rounds at once,
// nothing while the tab is hidden). Each GET /stats also extends the
// server's history of rates (history.js) that the overview's charts show.

import {h, fill, setText} from "./dom.js";
import * as api from "./api.js";
import {count, duration} from "./format.js";
import {notify} from "./widgets.js";
import {overviewView} from "./view-overview.js";
import {tubesView} from "./view-tubes.js";
import {tubeView} from "./view-tube.js";
import {jobView} from "./view-job.js";
import {subscriptionsView} from "./view-subscriptions.js";
import {tubeJobsView} from "./view-tube-jobs.js";
import {clientsView} from "./view-clients.js";
import * as serverHistory from "./history.js";

// The navigation, in order. A view is one row here, a route below and one
// module.
const NAV = [
  {id: "overview", label: "Overview", href: "#/overview"},
  {id: "tubes", label: "Tubes", href: "#/tubes"},
  {id: "clients", label: "Clients", href: "#/clients"},
  {id: "subscriptions", label: "Subscriptions", href: "#/subscriptions"},
];

// The view for a location hash: {nav, make, params}. make(main, params, app)
// builds the view into main and returns {title, refresh(stats)}.
function route(hash) {
  const [path, query] = hash.replace(/^#\/?/, "").split("?");
  const parts = path.split("/");
  if (parts[0] === "tubes" && parts.length === 2 && parts[1]) {
    return {nav: "tubes", make: tubeView, params: {name: decodeURIComponent(parts[1])}};
  }
  if (parts[0] === "tubes" && parts.length === 3 && parts[1] && parts[2] === "jobs") {
    return {nav: "tubes", make: tubeJobsView, params: {name: decodeURIComponent(parts[1]), query: new URLSearchParams(query || "")}};
  }
  if (parts[0] === "tubes" && parts.length === 1) {
    return {nav: "tubes", make: tubesView, params: new URLSearchParams(query || "")};
  }
  if (parts[0] === "jobs" && parts.length === 2 && /^[0-9]+$/.test(parts[1])) {
    return {nav: "tubes", make: jobView, params: {id: parts[1]}};
  }
  if (parts[0] === "clients" && parts.length === 1) {
    return {nav: "clients", make: clientsView, params: new URLSearchParams(query || "")};
  }
  if (parts[0] === "subscriptions" && parts.length === 1) {
    return {nav: "subscriptions", make: subscriptionsView, params: {}};
  }
  return {nav: "overview", make: overviewView, params: {}};
}

// ---- the loop -------------------------------------------------------------

// ?poll=MS on the page's URL changes the interval (100 ms to 60 s); it is
// there for tests and measurements. The default is once a second.
const POLL_MS = (() => {
  const asked = Number(new URLSearchParams(location.search).get("poll"));
  return asked >= 100 && asked <= 60000 ? asked : 1000;
})();

const main = document.getElementById("main");
let view = null;         // the view on screen
let timer = 0;
let running = false;     // a round is under way
let again = false;       // run another round as soon as this one ends
let waitingForToken = false;
let online = null;

const app = {
  // Run a round now (after an action), or right after the one under way.
  refreshNow() {
    if (running) { again = true; return; }
    clearTimeout(timer);
    timer = 0;
    round();
  },
};

async function round() {
  if (document.hidden || waitingForToken) return;   // visibilitychange / the token restart it
  running = true;
  const started = performance.now();
  try {
    const [stats] = await Promise.all([api.get("stats"), api.loadGrants()]);
    serverHistory.record(stats);
    showLive(stats);
    if (view) await view.refresh(stats);
  } catch (e) {
    failed(e);
  }
  running = false;
  if (again) { again = false; round(); return; }
  timer = setTimeout(round, Math.max(0, POLL_MS - (performance.now() - started)));
}

function failed(e) {
  if (e instanceof api.ApiError && e.status === 401) {
    askToken(api.token() !== "");
  } else if (e instanceof api.ApiError && e.status === 0) {
    setOnline(false);
  } else {
    notify(e.message || String(e), "error");
  }
}

function setOnline(yes) {
  if (online === yes) return;
  const before = online;
  online = yes;
  document.getElementById("live-dot").className = "dot " + (yes ? "on" : "off");
  if (!yes) {
    setText(document.getElementById("live-text"), "Server not reachable; trying again");
    notify("The server does not answer; the page keeps trying.", "error");
  } else if (before === false) {
    notify("The server answers again.", "ok");
  }
}

function showLive(stats) {
  setOnline(true);
  const state = stats.draining ? "draining" : stats.binlog_failed ? "log failing" : "live";
  setText(document.getElementById("live-text"),
    `${state} · v${stats.version} · up ${duration(stats.uptime)} · ${count(stats.current_tubes)} tubes`);
  document.getElementById("live").className = "live " + (state === "live" ? "" : "warn");
}

document.addEventListener("visibilitychange", () => {
  if (!document.hidden) app.refreshNow();
});

// ---- token ------------------------------------------------------------------

const tokenDialog = document.getElementById("token-dialog");
const tokenInput = document.getElementById("token-input");
const forget = document.getElementById("forget-token");

function askToken(refused) {
  waitingForToken = true;
  if (refused) api.setToken("");
  forget.hidden = true;
  setText(document.getElementById("token-msg"), refused
    ? "The server refused that token. Enter another one."
    : "This server asks for a bearer token.");
  if (!tokenDialog.open) tokenDialog.showModal();
  tokenInput.focus();
}

document.getElementById("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const value = tokenInput.value.trim();
  if (!value) return;
  api.setToken(value);
  tokenInput.value = "";
  waitingForToken = false;
  forget.hidden = false;
  tokenDialog.close();
  if (view) app.refreshNow();
  else show();   // the page said a token was needed: show the view now
});

document.getElementById("token-cancel").addEventListener("click", () => tokenDialog.close());

// Closed without a token (Cancel or Escape): say so, with a way back.
tokenDialog.addEventListener("close", () => {
  if (!waitingForToken) return;
  fill(main, h("section", {class: "card"},
    h("h1", {}, "A token is needed"),
    h("p", {}, "This server asks for a bearer token before it shows anything."),
    h("button", {type: "button", class: "primary", onclick: () => askToken(false)}, "Enter a token")));
  view = null;
});

forget.hidden = api.token() === "";
forget.addEventListener("click", () => {
  api.setToken("");
  notify("The token is forgotten.", "ok");
  app.refreshNow();
});

// ---- navigation ------------------------------------------------------------------

const navLinks = {};
for (const item of NAV) {
  navLinks[item.id] = h("a", {href: item.href}, item.label);
  document.getElementById("nav").append(h("li", {}, navLinks[item.id]));
}

function show() {
  if (!location.hash.startsWith("#/") && location.hash !== "") return;   // #main: the skip link
  const r = route(location.hash);
  for (const [id, link] of Object.entries(navLinks)) {
    if (id === r.nav) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  notify("", "ok");
  main.replaceChildren();
  view = r.make(main, r.params, app);
  document.title = view.title + " · beangate";
  app.refreshNow();
}

window.addEventListener("hashchange", () => {
  show();
  main.focus({preventScroll: true});
});
show();
