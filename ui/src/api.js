// The API as the page uses it: every call carries the user's bearer token, and a list is
// kept current by the API's own watch (?watch=1 read as a fetch stream), never by reloading.
import { useLayoutEffect, useState } from "preact/hooks";

const TOKEN_KEY = "gpufleet.token";
const NS_KEY = "gpufleet.namespace";

export const session = {
  get token() { return sessionStorage.getItem(TOKEN_KEY) || ""; },
  set token(v) { v ? sessionStorage.setItem(TOKEN_KEY, v) : sessionStorage.removeItem(TOKEN_KEY); },
  get namespace() { return sessionStorage.getItem(NS_KEY) || ""; },
  set namespace(v) { sessionStorage.setItem(NS_KEY, v || ""); },
};

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.reason = body && body.reason;
  }
}

function headers(extra) {
  return { Authorization: `Bearer ${session.token}`, Accept: "application/json", ...extra };
}

async function failed(res) {
  let body = null;
  try { body = await res.json(); } catch { /* not a Status */ }
  return new ApiError(res.status, body);
}

// The answer index.html asked for while the script loaded (once a path), else none.
function prefetched(path) {
  const early = window.__gpufleetPrefetch;
  const res = early && early[path];
  if (res) delete early[path];
  return res;
}

export async function get(path, signal) {
  const res = await fetch(path, { headers: headers(), signal });
  if (!res.ok) throw await failed(res);
  return res.json();
}

export async function post(path, body) {
  const res = await fetch(path, {
    method: "POST", headers: headers({ "Content-Type": "application/json" }), body: JSON.stringify(body),
  });
  if (!res.ok) throw await failed(res);
  return res.json();
}

// Lines of a streamed answer (a watch, a followed log), as they come.
export async function* lines(path, signal) {
  const res = await fetch(path, { headers: headers(), signal });
  if (!res.ok) throw await failed(res);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      yield buf.slice(0, nl);
      buf = buf.slice(nl + 1);
    }
  }
  if (buf) yield buf;
}

// What the first view does not need (the namespace list, the metrics, the user's name) is asked
// for once the lists it did ask for have come, or after a while: the browser holds six
// connections to a host and the server answers one request at a time per CPU, so the first
// view's lists go first.
const firstLists = new Set();
let firstDone = false;
let releaseFirst;
const firstListsCame = new Promise((r) => { releaseFirst = r; });
const FIRST_WAIT_MS = 2000;
setTimeout(() => finishFirst(), FIRST_WAIT_MS);

function finishFirst() {
  if (firstDone) return;
  firstDone = true;
  setTimeout(releaseFirst, 0); // after the view those lists fill has been drawn
}

function firstListCame(c) {
  if (!firstLists.delete(c) || firstLists.size) return;
  finishFirst();
}

let firstReleased = false;
firstListsCame.then(() => { firstReleased = true; });

export function afterFirstLists() { return firstListsCame; }

// Whether the first view's lists have come, as state of a view.
export function useAfterFirstLists() {
  const [came, setCame] = useState(firstReleased);
  useLayoutEffect(() => {
    let live = true;
    firstListsCame.then(() => { if (live) setCame(true); });
    return () => { live = false; };
  }, []);
  return came;
}

const key = (o) => `${o.metadata.namespace || ""}/${o.metadata.name}`;

// One list+watch per collection path, shared by every view that shows it.
class Collection {
  constructor(path) {
    this.path = path;
    this.items = new Map();
    this.error = null;
    this.loaded = false;
    this.listeners = new Set();
    this.version = 0;
    this.timer = null;
    this.ctrl = null;
    this.cached = [];
    this.arrayVersion = -1;
  }

  // The items as an array, the same one until the collection changes (views memoize on it).
  get array() {
    if (this.arrayVersion !== this.version) {
      this.cached = [...this.items.values()];
      this.arrayVersion = this.version;
    }
    return this.cached;
  }

  changed(now = false) {
    this.version++;
    const notify = () => { this.timer = null; this.listeners.forEach((f) => f(this.version)); };
    if (now) {
      clearTimeout(this.timer);
      notify();
      return;
    }
    if (this.timer) return;
    // Events come in bursts: one render for a burst.
    this.timer = setTimeout(notify, 40);
  }

  start() {
    if (!firstDone) firstLists.add(this);
    this.ctrl = new AbortController();
    this.relist();
  }

  stop() {
    firstListCame(this);
    watches.remove(this);
    if (this.ctrl) this.ctrl.abort();
    this.ctrl = null;
  }

  async list(signal) {
    const early = prefetched(this.path);
    if (early) {
      const res = await early;
      if (res.ok) return res.json();
    }
    return get(this.path, signal);
  }

  // List, then watch from the list's resourceVersion on the page's one stream (watches below).
  async relist() {
    watches.remove(this);
    const signal = this.ctrl && this.ctrl.signal;
    while (signal && !signal.aborted) {
      try {
        const list = await this.list(signal);
        this.items = new Map((list.items || []).map((o) => [key(o), o]));
        this.rv = list.metadata.resourceVersion;
        this.error = null;
        this.loaded = true;
        this.changed(true); // the first view waits for no burst
        firstListCame(this);
        watches.add(this);
        return;
      } catch (e) {
        if (signal.aborted) return;
        if (!this.failed(e)) return;
        await new Promise((r) => setTimeout(r, 1000));
      }
    }
  }

  // Whether to try again after this error.
  failed(e) {
    this.error = e;
    this.loaded = true;
    this.changed();
    firstListCame(this);
    return !(e instanceof ApiError && (e.status === 403 || e.status === 404 || e.status === 401));
  }

  get watchPath() {
    const sep = this.path.includes("?") ? "&" : "?";
    return `${this.path}${sep}allowWatchBookmarks=true&resourceVersion=${encodeURIComponent(this.rv)}`;
  }

  event(ev) {
    if (ev.type === "ERROR") { // e.g. 410 Gone: list again
      this.relist();
      return;
    }
    const rv = ev.object && ev.object.metadata && ev.object.metadata.resourceVersion;
    if (rv) this.rv = rv;
    if (ev.type === "BOOKMARK") return;
    if (ev.type === "DELETED") this.items.delete(key(ev.object));
    else this.items.set(key(ev.object), ev.object);
    this.changed();
  }

  refused(status) {
    watches.remove(this);
    if (this.failed(new ApiError(status.code, status))) setTimeout(() => { if (this.ctrl) this.relist(); }, 1000);
  }
}

// Every collection's watch on one stream (GET /ui/watch?path=...&path=...): a browser holds
// six connections to a host, and a view of several kinds would otherwise hold them all with
// watches, leaving its lists, logs and metrics waiting. The stream is opened again, each
// watch from its latest resourceVersion, when a collection joins or leaves.
const watches = {
  members: new Map(), // collection -> a number, new each time it joins
  joined: 0,
  ctrl: null,
  timer: null,

  add(c) { this.members.set(c, ++this.joined); this.reopenSoon(); },

  remove(c) { if (this.members.delete(c)) this.reopenSoon(); },

  reopenSoon(ms = 20) {
    if (this.timer) return;
    this.timer = setTimeout(() => { this.timer = null; this.open(); }, ms);
  },

  async open() {
    if (this.ctrl) this.ctrl.abort();
    this.ctrl = null;
    const members = [...this.members];
    if (!members.length) return;
    const ctrl = (this.ctrl = new AbortController());
    const query = members.map(([c]) => `path=${encodeURIComponent(c.watchPath)}`).join("&");
    let again = true;
    try {
      for await (const line of lines(`/ui/watch?${query}`, ctrl.signal)) {
        if (!line.trim()) continue;
        const m = JSON.parse(line);
        const [c, joined] = members[m.stream] || [];
        if (!c || this.members.get(c) !== joined) continue; // it left, or listed again since
        if (m.event) c.event(m.event);
        else if (m.status) c.refused(m.status);
        else if (m.end) this.reopenSoon(); // its watch timed out: watch again from where it was
      }
    } catch (e) {
      if (ctrl.signal.aborted) return;
      again = !(e instanceof ApiError && e.status === 401);
    }
    // The stream ended (the server went away, or restarted): open it again after a pause.
    if (this.ctrl === ctrl) {
      this.ctrl = null;
      if (again) this.reopenSoon(1000);
    }
  },
};

const collections = new Map();

// The items at a collection path (a list URL), kept live; null path: nothing.
export function useList(path) {
  const [, setVersion] = useState(0);
  // A layout effect: the list is asked for before the browser paints the empty view, not after.
  useLayoutEffect(() => {
    if (!path) return undefined;
    let c = collections.get(path);
    if (!c) {
      c = new Collection(path);
      collections.set(path, c);
      c.start();
    }
    c.listeners.add(setVersion);
    setVersion(c.version);
    return () => {
      c.listeners.delete(setVersion);
      if (c.listeners.size === 0) {
        c.stop();
        if (collections.get(path) === c) collections.delete(path);
      }
    };
  }, [path]);
  const c = path && collections.get(path);
  if (!c) return { items: [], loaded: false, error: null };
  return { items: c.array, loaded: c.loaded, error: c.error };
}

export function stopAll() {
  collections.forEach((c) => c.stop());
  collections.clear();
}

// A collection's path, in a namespace or across all ("").
export function listPath(prefix, resource, namespace) {
  return namespace ? `${prefix}/namespaces/${encodeURIComponent(namespace)}/${resource}` : `${prefix}/${resource}`;
}
