// api.js - the gateway's HTTP API, as the page uses it.
//
// The page is served at /ui/, so the API is one level up ("../stats"):
// relative URLs keep working behind a proxy that adds a prefix. With bearer
// tokens on, the token lives in sessionStorage (this tab only, gone when it
// closes) and goes out as an Authorization header, never in a URL. A scoped
// token may do only some kinds of action on some tubes: GET /auth says
// which, and may() answers from that for the views to hide the rest.

const TOKEN_KEY = "beangate-token";
const root = new URL("../", document.baseURI);

// A problem+json answer (or a failure to reach the server: status 0).
export class ApiError extends Error {
  constructor(status, code, detail) {
    super(status ? `${status} ${code}: ${detail}` : detail);
    this.status = status;
    this.code = code;
    this.detail = detail;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

// A tube's path in the API, its name as one segment: '/' becomes %2F, as
// the gateway wants, and each dot of a name "." or ".." %252E. A browser
// drops such segments from a URL even when written %2E (WHATWG URL), so
// "tubes/.." would mean the root; the gateway decodes the %2E that is left
// after its unescaping (gw_decode_segment).
export function tubePath(name) {
  const segment = name === "." || name === ".." ? name.replaceAll(".", "%252E") : encodeURIComponent(name);
  return "tubes/" + segment;
}

// The address of a tube's view in this page (a fragment: kept as written).
export function tubeHref(name) {
  return "#/tubes/" + encodeURIComponent(name);
}

// The address of a tube's jobs of one state in this page.
export function tubeJobsHref(name, state) {
  return tubeHref(name) + "/jobs?state=" + state;
}

// The address of a client in this page: the Clients view, showing it.
export function clientHref(id) {
  return "#/clients?client=" + id;
}

// Call the API: method, a path relative to the root ("stats",
// "tubes/x/kick"), query parameters (undefined ones left out), a body, and
// `raw` to get the bytes. Resolves to the JSON (null for 204) or a
// Uint8Array; rejects with an ApiError.
export async function call(method, path, {query, body, raw} = {}) {
  const url = new URL(path, root);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, String(v));
  }
  const headers = {Accept: raw ? "application/octet-stream" : "application/json"};
  const t = token();
  if (t) headers.Authorization = "Bearer " + t;
  let resp;
  try {
    resp = await fetch(url, {method, headers, body, cache: "no-store", credentials: "omit"});
  } catch (e) {
    throw new ApiError(0, "UNREACHABLE", "the server does not answer");
  }
  if (!resp.ok) {
    let code = "HTTP_" + resp.status, detail = resp.statusText;
    try {
      const doc = await resp.json();
      code = doc.code || code;
      detail = doc.detail || detail;
    } catch (e) { /* not problem+json */ }
    throw new ApiError(resp.status, code, detail);
  }
  if (raw) return new Uint8Array(await resp.arrayBuffer());
  if (resp.status === 204) return null;
  return resp.json();
}

export const get = (path, query) => call("GET", path, {query});
export const post = (path, query, body) => call("POST", path, {query, body});
export const del = (path, query) => call("DELETE", path, {query});

// What the token may do: GET /auth's grants, [{kinds, tubes}]; "*" among
// a grant's tubes is every tube. Without a token: everything (the server
// has no tokens, or answers 401 and the page asks for one).
const EVERYTHING = [{kinds: ["produce", "consume", "manage", "read"], tubes: ["*"]}];
let grants = EVERYTHING;
let grantsOf = "";      // the token they are of
let scoped = false;

// Ask the server what the token may do: each round for a scoped token (its
// grants name the tubes that exist, and tubes come and go), once for an
// unscoped one (it stays so), never without a token.
export async function loadGrants() {
  const t = token();
  if (t === grantsOf && !scoped) return;
  if (!t) {
    grants = EVERYTHING;
    scoped = false;
  } else {
    const answer = await get("auth");
    if (t !== token()) return;   // the token changed meanwhile: the next round asks
    grants = answer.grants;
    scoped = answer.scoped;
  }
  grantsOf = t;
}

// Whether the token may do `kind` (produce, consume, manage, read) on tube.
export function may(kind, tube) {
  return grants.some((g) => g.kinds.includes(kind) && (g.tubes.includes("*") || g.tubes.includes(tube)));
}
