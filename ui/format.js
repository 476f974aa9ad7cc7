// format.js - numbers, durations and sizes as people read them.

const integer = new Intl.NumberFormat("en-US");
const decimal = new Intl.NumberFormat("en-US", {maximumFractionDigits: 1});

export const count = (n) => integer.format(n);

// A number with at most one decimal ("2.5", "1,024").
export const number = (n) => decimal.format(n);

// A rate per second: one decimal below 100.
export const rate = (r) => (r >= 100 ? integer.format(Math.round(r)) : decimal.format(r)) + "/s";

// Seconds as "3d 4h", "2h 5m", "4m 10s", "12s".
export function duration(seconds) {
  let s = Math.max(0, Math.floor(seconds));
  const d = Math.floor(s / 86400); s -= d * 86400;
  const hr = Math.floor(s / 3600); s -= hr * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  if (d) return `${d}d ${hr}h`;
  if (hr) return `${hr}h ${m}m`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}

// Bytes as "512 B", "1.5 KiB", "12.3 MiB".
export function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? decimal.format(n) : integer.format(n)) + " " + units[i];
}

// Milliseconds ago as "0.3 s ago", "12 s ago", "4m 10s ago".
export function ago(ms) {
  if (ms < 10000) return decimal.format(ms / 1000) + " s ago";
  return duration(ms / 1000) + " ago";
}

// A Unix time in seconds as "12s ago (2026-11-23 17:57:49 UTC)".
export function when(unixSeconds) {
  const iso = new Date(unixSeconds * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  return `${duration(Date.now() / 1000 - unixSeconds)} ago (${iso})`;
}

// ---- push delivery ------------------------------------------------------

// What each failure of push delivery means (docs/http.md, "What the answer
// means"); an unknown name stands for itself.
const DELIVERY_ERRORS = {
  retry_after: "the endpoint asked for a later retry (Retry-After)",
  http_429: "the endpoint answered 429 Too Many Requests",
  http_5xx: "the endpoint answered a server error (5xx)",
  timeout: "no complete answer within the timeout",
  connect_failed: "no connection (refused, unreachable, or the name did not resolve)",
  connection_error: "the connection closed or reset, or the answer was not HTTP",
  bad_status: "a status outside 200-599",
  tls_error: "https: the TLS handshake or the receiver's certificate failed",
  http_3xx: "a redirect, which is not followed",
  http_4xx: "a client error (4xx)",
  attempts_exhausted: "the last allowed attempt failed",
};
export const deliveryMeaning = (error) => DELIVERY_ERRORS[error] || error;

// A delivery failure {status, error, at, attempt} as one line of text:
// "HTTP 500 (http_5xx: the endpoint answered a server error (5xx)), attempt 2, 12s ago (...)".
export function deliveryError(e) {
  const status = e.status === null || e.status === undefined ? "no HTTP answer" : `HTTP ${e.status}`;
  return `${status} (${e.error}: ${deliveryMeaning(e.error)}), attempt ${count(e.attempt)}, ${when(e.at)}`;
}

// ---- job bodies -------------------------------------------------------

const TEXT_LIMIT = 64 * 1024;   // characters shown as text or JSON
const HEX_LIMIT = 4096;         // bytes shown as hex

// The bytes of a job JSON's body (`body` text or `body_base64`).
export function bodyBytes(job) {
  if (typeof job.body === "string") return new TextEncoder().encode(job.body);
  const bin = atob(job.body_base64 || "");
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

// {text, utf8}: the bytes as text (U+FFFD where they are not UTF-8).
export function decodeText(data) {
  try {
    return {text: new TextDecoder("utf-8", {fatal: true}).decode(data), utf8: true};
  } catch (e) {
    return {text: new TextDecoder("utf-8").decode(data), utf8: false};
  }
}

// A classic dump: offset, perRow bytes in hex (16 unless asked), the
// printable ASCII.
export function hexDump(data, perRow = 16) {
  const lines = [];
  const n = Math.min(data.length, HEX_LIMIT);
  for (let off = 0; off < n; off += perRow) {
    const row = data.subarray(off, Math.min(off + perRow, n));
    const hex = Array.from(row, (b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = Array.from(row, (b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : ".")).join("");
    lines.push(off.toString(16).padStart(8, "0") + "  " + hex.padEnd(3 * perRow - 1) + "  |" + ascii + "|");
  }
  if (data.length > n) lines.push(`… ${count(data.length - n)} more bytes`);
  return lines.join("\n");
}

// The characters a hex dump line of perRow bytes takes (hexDump's layout).
export const hexLineChars = (perRow) => 8 + 2 + 3 * perRow - 1 + 2 + perRow + 2;

// The preview of a body in one mode: {text, note}. mode: text, hex, json.
// perRow: the bytes per line of the hex mode.
export function preview(data, mode, perRow) {
  if (mode === "hex") return {text: hexDump(data, perRow), note: ""};
  const {text, utf8} = decodeText(data);
  if (mode === "json") {
    try {
      return {text: cut(JSON.stringify(JSON.parse(text), null, 2)), note: ""};
    } catch (e) {
      return {text: cut(text), note: "Not valid JSON (" + e.message + "); shown as text."};
    }
  }
  return {text: cut(text), note: utf8 ? "" : "Not valid UTF-8: shown with � for the bytes that are not."};
}

function cut(text) {
  return text.length > TEXT_LIMIT ? text.slice(0, TEXT_LIMIT) + `\n… ${count(text.length - TEXT_LIMIT)} more characters` : text;
}

// The mode a body opens in: JSON if it parses (and is an object or array),
// text if it is UTF-8, else hex.
export function defaultMode(data) {
  const {text, utf8} = decodeText(data);
  if (!utf8) return "hex";
  const t = text.trim();
  if (t.startsWith("{") || t.startsWith("[")) {
    try { JSON.parse(t); return "json"; } catch (e) { /* text */ }
  }
  return "text";
}
