// dom.js - building the page without HTML strings.
//
// Every piece of data (tube names, job bodies, error details) reaches the
// page as a text node or a property, never as markup: there is no
// innerHTML, outerHTML, insertAdjacentHTML or document.write in this folder
// (tests/ui/test_ui.py checks), and the server's Content-Security-Policy
// turns on Trusted Types, so such a call would throw anyway.

import {count} from "./format.js";

const SVG_NS = "http://www.w3.org/2000/svg";

// Set attributes on node: class, text, events as "onX" functions, the rest
// with setAttribute. An attribute that would run code is refused.
function apply(node, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else if (key.startsWith("on")) throw new Error("dom: refusing attribute " + key);
    else if (key === "href" && !String(value).startsWith("#")) throw new Error("dom: links stay in the page: " + value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  return node;
}

// append children: nodes, or anything else as text.
function add(node, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// h("tag", {attrs}, ...children): a new HTML element.
export function h(tag, attrs, ...children) {
  return add(apply(document.createElement(tag), attrs), children);
}

// s("tag", {attrs}, ...children): a new SVG element.
export function s(tag, attrs, ...children) {
  return add(apply(document.createElementNS(SVG_NS, tag), attrs), children);
}

// Replace every child of node with children.
export function fill(node, ...children) {
  node.replaceChildren();
  return add(node, children);
}

// Set the text of node if it changed (no work, and no screen-reader noise,
// when a poll brings the same value).
export function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) node.textContent = value;
}

// Show doc's numbers in a facts list: {key: field} sets values[key] to
// doc[field], formatted as a count.
export function setCounts(values, doc, fields) {
  for (const [key, field] of Object.entries(fields)) setText(values[key], count(doc[field]));
}

// A <dl> of [label, value node] pairs; returns {dl, values: {key: <dd>}}.
export function definitionList(rows, className) {
  const dl = h("dl", {class: className || "facts"});
  const values = {};
  for (const [key, label] of rows) {
    values[key] = h("dd", {"data-key": key}, "…");
    dl.append(h("div", {}, h("dt", {}, label), values[key]));
  }
  return {dl, values};
}
