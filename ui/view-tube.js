// view-tube.js - one tube: its counts and rates, links to its jobs by
// state (view-tube-jobs.js), the next ready, delayed and buried
// job (peek) with their bodies, its push subscription if it has one (from
// GET /stats), and the actions: kick N, pause for N seconds, unpause, kick
// or delete a peeked job, put a job. The tube's
// stats are polled; the peeks are asked again only when the counts moved,
// after an action, or every 5 s (for the ages), and only for states that
// have jobs.

import {h, setText, setCounts, definitionList} from "./dom.js";
import * as api from "./api.js";
import {count, duration, rate, bodyBytes} from "./format.js";
import {act, bodyViewer, confirmAction} from "./widgets.js";

const PEEK_EVERY_MS = 5000;

// A form of one number field and its buttons; the value is checked here as
// the server would (a whole number in range).
function numberField(id, label, value, min, max) {
  const input = h("input", {id, type: "number", inputmode: "numeric", min, max, step: "1", value, required: true});
  return {
    input,
    label: h("label", {for: id}, label),
    value() {
      const n = Number(input.value);
      if (!Number.isInteger(n) || n < min || n > max) {
        input.setAttribute("aria-invalid", "true");
        input.focus();
        throw new Error(`${label}: a whole number from ${count(min)} to ${count(max)}`);
      }
      input.removeAttribute("aria-invalid");
      return n;
    },
  };
}

// One peek panel: the job that a state would give next.
function peekPanel(kind, title, tube, app, onChange) {
  const empty = h("p", {class: "muted"}, "None.");
  const idLink = h("a", {href: "#/tubes"});
  const facts = definitionList([["id", "Job"], ["priority", "Priority"], ["age", "Age"], ["left", "Time left"]], "facts compact");
  facts.values.id.replaceChildren(idLink);
  const viewer = bodyViewer(`Body of the next ${kind} job`);
  const kick = h("button", {type: "button", hidden: true}, "Kick this job");
  const del = h("button", {type: "button", class: "danger", hidden: true}, "Delete this job");
  const content = h("div", {hidden: true}, facts.dl, viewer.node, h("div", {class: "buttons"}, kick, del));
  const node = h("article", {class: "card peek", "aria-label": title}, h("h3", {}, title), empty, content);
  let job = null;

  kick.addEventListener("click", () => act(app, async () => {
    await api.post(`jobs/${job.id}/kick`);
    onChange();
    return `Job ${job.id} kicked: it is ready.`;
  }));
  del.addEventListener("click", async () => {
    const id = job.id;
    if (!(await confirmAction(`Delete job ${id} of tube ${tube}? This cannot be undone.`, "Delete job"))) return;
    act(app, async () => {
      await api.del(`jobs/${id}`);
      onChange();
      return `Job ${id} deleted.`;
    });
  });

  return {
    node,
    show(j) {
      job = j;
      empty.hidden = !!j;
      content.hidden = !j;
      if (!j) return;
      // kick and delete of any job: a token that may manage the tube
      const manage = api.may("manage", tube);
      kick.hidden = kind === "ready" || !manage;
      del.hidden = !manage;
      idLink.setAttribute("href", `#/jobs/${j.id}`);
      setText(idLink, String(j.id));
      setText(facts.values.priority, count(j.priority));
      setText(facts.values.age, duration(j.age));
      setText(facts.values.left, j.state === "delayed" ? duration(j.time_left) : "–");
      viewer.show(bodyBytes(j), j.id);
    },
  };
}

export function tubeView(main, {name}, app) {
  const path = api.tubePath(name);
  const stats = definitionList([
    ["ready", "Ready"], ["reserved", "Reserved"], ["delayed", "Delayed"], ["buried", "Buried"],
    ["urgent", "Urgent"], ["waiting", "Waiting"], ["watching", "Watching"], ["using", "Using"],
    ["total", "Put since created"], ["deletes", "Deleted"], ["put_rate", "Puts per second"],
    ["delete_rate", "Deletes per second"], ["pause", "Paused"],
  ], "facts states");
  // the jobs of each state, a page at a time: links with the counts
  const browse = {};
  const browseNav = h("nav", {class: "browse", "aria-label": "Browse the jobs"}, h("span", {class: "muted"}, "Browse the jobs:"),
    ["ready", "delayed", "buried", "reserved"].map((st) => {
      browse[st] = h("a", {href: api.tubeJobsHref(name, st), "data-state": st}, st);
      return browse[st];
    }));
  const missing = h("p", {class: "notice-inline", hidden: true},
    "There is no such tube now. A tube exists while it has jobs or clients that use or watch it.");
  const pushUrl = h("span", {class: "name"});
  const pushed = h("p", {class: "pushed", hidden: true}, "Push delivery: its jobs are POSTed to ", pushUrl, " (",
    h("a", {href: "#/subscriptions"}, "Subscriptions"), ").");

  let signature = "", peekedAt = 0, forcePeek = true;
  const again = () => { forcePeek = true; };
  const panels = {
    ready: peekPanel("ready", "Next ready", name, app, again),
    delayed: peekPanel("delayed", "Next delayed", name, app, again),
    buried: peekPanel("buried", "Oldest buried", name, app, again),
  };

  // kick N
  const kickN = numberField("kick-bound", "Jobs to kick", "1", 1, 4294967295);
  const kickForm = h("form", {class: "inline-form", novalidate: true, "aria-label": "Kick jobs"}, kickN.label, kickN.input,
    h("button", {type: "submit"}, "Kick"));
  kickForm.addEventListener("submit", (e) => {
    e.preventDefault();
    act(app, async () => {
      const r = await api.post(`${path}/kick`, {bound: kickN.value()});
      again();
      return `Kicked ${count(r.kicked)} ${r.kicked === 1 ? "job" : "jobs"} (buried ones first, else delayed).`;
    });
  });

  // pause N seconds / unpause
  const pauseN = numberField("pause-seconds", "Pause for (seconds)", "60", 1, 4294967295);
  const unpause = h("button", {type: "button", disabled: true}, "Unpause");
  const pauseForm = h("form", {class: "inline-form", novalidate: true, "aria-label": "Pause the tube"}, pauseN.label, pauseN.input,
    h("button", {type: "submit"}, "Pause"), unpause);
  pauseForm.addEventListener("submit", (e) => {
    e.preventDefault();
    act(app, async () => {
      const seconds = pauseN.value();
      await api.post(`${path}/pause`, {delay: seconds});
      return `Tube paused for ${duration(seconds)}: no job of it is reserved until then.`;
    });
  });
  unpause.addEventListener("click", () => act(app, async () => {
    await api.post(`${path}/pause`, {delay: 0});
    return "Tube unpaused.";
  }));

  // put
  const body = h("textarea", {id: "put-body", rows: "4", spellcheck: "false"});
  const pri = numberField("put-priority", "Priority", "2147483648", 0, 4294967295);
  const delay = numberField("put-delay", "Delay (s)", "0", 0, 4294967295);
  const ttr = numberField("put-ttr", "TTR (s)", "60", 0, 4294967295);
  const putForm = h("form", {class: "put-form", novalidate: true, "aria-label": "Put a job"},
    h("label", {for: "put-body"}, "Body"), body,
    h("div", {class: "fields"}, [pri, delay, ttr].map((f) => h("div", {}, f.label, f.input))),
    h("button", {type: "submit", class: "primary"}, "Put job"));
  putForm.addEventListener("submit", (e) => {
    e.preventDefault();
    act(app, async () => {
      const r = await api.post(`${path}/jobs`, {priority: pri.value(), delay: delay.value(), ttr: ttr.value()}, body.value);
      again();
      return `Put job ${r.id} (${r.state}).`;
    });
  });

  // what the token may do here (api.may): the rest is not shown
  const putPart = [h("h3", {}, "Put a job"), putForm];
  const actions = h("section", {class: "card", "aria-label": "Actions"}, h("h2", {}, "Actions"),
    kickForm, pauseForm, ...putPart);
  function showActions() {
    const manage = api.may("manage", name), produce = api.may("produce", name);
    kickForm.hidden = pauseForm.hidden = !manage;
    for (const node of putPart) node.hidden = !produce;
    actions.hidden = !manage && !produce;
  }
  showActions();

  main.append(
    h("nav", {class: "crumbs", "aria-label": "Breadcrumb"}, h("a", {href: "#/tubes"}, "Tubes"), " › ", h("span", {}, name)),
    h("h1", {}, "Tube ", h("span", {class: "name"}, name)),
    pushed,
    missing,
    h("div", {class: "cards"},
      h("section", {class: "card", "aria-label": "Counts"}, h("h2", {}, "Counts"), stats.dl),
      actions),
    browseNav,
    h("h2", {}, "Next jobs"),
    h("div", {class: "cards peeks"}, panels.ready.node, panels.delayed.node, panels.buried.node),
  );

  async function peek(kind) {
    try {
      return await api.get(`${path}/${kind}`);
    } catch (e) {
      if (e.status === 404) return null;
      throw e;
    }
  }

  return {
    title: "Tube " + name,
    async refresh(server) {
      showActions();
      const sub = ((server && server.subscriptions) || []).find((x) => x.tube === name);
      pushed.hidden = !sub;
      if (sub) setText(pushUrl, sub.url);
      let t;
      try {
        t = await api.get(path);
      } catch (e) {
        if (e.status !== 404) throw e;
        missing.hidden = false;
        for (const dd of Object.values(stats.values)) setText(dd, "–");
        for (const p of Object.values(panels)) p.show(null);
        return;
      }
      missing.hidden = true;
      const v = stats.values;
      setCounts(v, t, {
        ready: "current_jobs_ready", reserved: "current_jobs_reserved", delayed: "current_jobs_delayed",
        buried: "current_jobs_buried", urgent: "current_jobs_urgent", waiting: "current_waiting",
        watching: "current_watching", using: "current_using", total: "total_jobs", deletes: "cmd_delete",
      });
      setText(v.put_rate, rate(t.rates.put));
      setText(v.delete_rate, rate(t.rates.delete));
      for (const [st, link] of Object.entries(browse)) setText(link, `${st[0].toUpperCase()}${st.slice(1)} (${count(t["current_jobs_" + st])})`);
      const paused = t.pause_time_left > 0;
      setText(v.pause, paused ? `Yes, ${duration(t.pause_time_left)} left (of ${duration(t.pause)})` : "No");
      v.pause.className = paused ? "warn" : "";
      unpause.disabled = !paused;

      const sig = [t.current_jobs_ready, t.current_jobs_delayed, t.current_jobs_buried, t.total_jobs, t.cmd_delete].join();
      const now = performance.now();
      if (forcePeek || sig !== signature || now - peekedAt > PEEK_EVERY_MS) {
        forcePeek = false;
        signature = sig;
        peekedAt = now;
        // a state with no job has nothing to peek: no request
        const [ready, delayed, buried] = await Promise.all([
          t.current_jobs_ready ? peek("ready") : null,
          t.current_jobs_delayed ? peek("delayed") : null,
          t.current_jobs_buried ? peek("buried") : null,
        ]);
        panels.ready.show(ready);
        panels.delayed.show(delayed);
        panels.buried.show(buried);
      }
    },
  };
}
