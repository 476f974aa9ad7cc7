// view-job.js - one job: every field of stats-job, the client that holds
// it reserved (a link to it), its body (raw bytes,
// shown as text, hex or JSON), the last failure of its push delivery (when
// its tube is delivered by push and an attempt failed), and kick and
// delete (shown only to a token that may manage the tube). The stats are polled; the body is fetched once (a job's body
// never changes).

import {h, setText, setCounts, definitionList} from "./dom.js";
import * as api from "./api.js";
import {count, duration, deliveryMeaning, when} from "./format.js";
import {bodyViewer, confirmAction, notify, showHolder} from "./widgets.js";

export function jobView(main, {id}, app) {
  const facts = definitionList([
    ["id", "Id"], ["tube", "Tube"], ["state", "State"], ["priority", "Priority"], ["age", "Age"],
    ["delay", "Delay"], ["ttr", "Time to run"], ["time_left", "Time left"], ["reserves", "Reserves"],
    ["timeouts", "Timeouts"], ["releases", "Releases"], ["buries", "Buries"], ["kicks", "Kicks"],
    ["reserved_by", "Reserved by"],
  ], "facts");
  const tubeLink = h("a", {href: "#/tubes"});
  facts.values.tube.replaceChildren(tubeLink);
  const viewer = bodyViewer(`Body of job ${id}`);
  const kick = h("button", {type: "button", disabled: true}, "Kick");
  const del = h("button", {type: "button", class: "danger", disabled: true}, "Delete");
  const why = h("p", {class: "muted", hidden: true},
    "A reserved job belongs to its worker: it can be deleted only with its reservation.");
  const gone = h("p", {class: "notice-inline", hidden: true}, `There is no job ${id}: it was deleted, or never existed.`);
  const failure = definitionList([
    ["error", "Error"], ["status", "HTTP status"], ["attempt", "Attempt"], ["at", "When"],
  ], "facts delivery");
  const delivery = h("section", {class: "card", "aria-label": "Last delivery error", hidden: true},
    h("h2", {}, "Last delivery error"), failure.dl,
    h("p", {class: "muted"}, "The last failed push attempt of this job; it is forgotten once the job is delivered. ",
      h("a", {href: "#/subscriptions"}, "See the subscriptions")));
  const content = h("div", {class: "cards"},
    h("section", {class: "card", "aria-label": "Statistics"}, h("h2", {}, "Statistics"), facts.dl,
      h("div", {class: "buttons"}, kick, del), why),
    delivery,
    h("section", {class: "card wide", "aria-label": "Body"}, h("h2", {}, "Body"), viewer.node));
  const crumbTube = h("a", {href: "#/tubes"});
  const crumbStep = h("span", {hidden: true}, " › ", crumbTube);   // once the tube is known
  main.append(
    h("nav", {class: "crumbs", "aria-label": "Breadcrumb"}, h("a", {href: "#/tubes"}, "Tubes"), crumbStep,
      " › ", h("span", {}, `Job ${id}`)),
    h("h1", {}, `Job ${id}`),
    gone, content);
  let job = null, haveBody = false, ended = false;

  kick.addEventListener("click", async () => {
    try {
      await api.post(`jobs/${id}/kick`);
      notify(`Job ${id} kicked: it is ready.`, "ok");
    } catch (e) {
      notify(e.message, "error");
    }
    app.refreshNow();
  });
  del.addEventListener("click", async () => {
    if (!(await confirmAction(`Delete job ${id} of tube ${job.tube}? This cannot be undone.`, "Delete job"))) return;
    try {
      await api.del(`jobs/${id}`);
      notify(`Job ${id} deleted.`, "ok");
    } catch (e) {
      notify(e.message, "error");
    }
    app.refreshNow();
  });

  function end() {
    ended = true;
    gone.hidden = false;
    content.hidden = true;
  }

  return {
    title: `Job ${id}`,
    async refresh() {
      if (ended) return;   // a deleted job does not come back: ask no more
      try {
        job = await api.get(`jobs/${id}`);
        if (!haveBody) {
          viewer.show(await api.call("GET", `jobs/${id}/body`, {raw: true}), id);
          haveBody = true;
        }
      } catch (e) {
        if (e.status === 404) return end();
        throw e;
      }
      const v = facts.values;
      setText(v.id, String(job.id));
      for (const link of [tubeLink, crumbTube]) {
        link.setAttribute("href", api.tubeHref(job.tube));
        setText(link, job.tube);
      }
      crumbStep.hidden = false;
      setText(v.state, job.state);
      setText(v.priority, count(job.priority));
      setText(v.age, duration(job.age));
      setText(v.delay, duration(job.delay));
      setText(v.ttr, duration(job.ttr));
      setText(v.time_left, job.state === "reserved" || job.state === "delayed" ? duration(job.time_left) : "–");
      setCounts(v, job, {reserves: "reserves", timeouts: "timeouts", releases: "releases", buries: "buries", kicks: "kicks"});
      showHolder(v.reserved_by, job.state === "reserved" ? job.reserved_by : undefined);
      const e = job.last_delivery_error;
      delivery.hidden = !e;
      if (e) {
        setText(failure.values.error, `${e.error}: ${deliveryMeaning(e.error)}`);
        setText(failure.values.status, e.status === null ? "none (no HTTP answer)" : String(e.status));
        setText(failure.values.attempt, count(e.attempt));
        setText(failure.values.at, when(e.at));
      }
      // a scoped token without manage on the tube sees no action
      kick.hidden = del.hidden = !api.may("manage", job.tube);
      kick.disabled = job.state !== "buried" && job.state !== "delayed";
      del.disabled = job.state === "reserved";
      why.hidden = job.state !== "reserved";
    },
  };
}
