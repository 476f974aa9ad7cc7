// format.js - numbers, durations and sizes as people read them.

const integer = new Intl.NumberFormat("en-US");
const decimal = new Intl.NumberFormat("en-US", {maximumFractionDigits: 1});

export const count = (n) => integer.format(n);

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

// A classic dump: offset, 16 bytes in hex, the printable ASCII.
export function hexDump(data) {
  const lines = [];
  const n = Math.min(data.length, HEX_LIMIT);
  for (let off = 0; off < n; off += 16) {
    const row = data.subarray(off, Math.min(off + 16, n));
    const hex = Array.from(row, (b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = Array.from(row, (b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : ".")).join("");
    lines.push(off.toString(16).padStart(8, "0") + "  " + hex.padEnd(47) + "  |" + ascii + "|");
  }
  if (data.length > n) lines.push(`… ${count(data.length - n)} more bytes`);
  return lines.join("\n");
}

// The preview of a body in one mode: {text, note}. mode: text, hex, json.
export function preview(data, mode) {
  if (mode === "hex") return {text: hexDump(data), note: ""};
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
