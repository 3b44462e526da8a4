import { Component, render } from "preact";
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { Link, Redirect, Route, Router, Switch, useLocation, useParams, useSearch } from "wouter-preact";
import "uplot/dist/uPlot.min.css";
import "./style.css";
import { afterFirstLists, ApiError, get, lines, listPath, post, session, stopAll, useAfterFirstLists, useList } from "./api.js";

const GPU = "nvidia.com/gpu";
const ANN = {
  gpus: "gpufleet.io/gpus", health: "gpufleet.io/gpu-health", cordon: "gpufleet.io/gpu-cordon",
  indices: "gpufleet.io/gpu-indices", metrics: "gpufleet.io/gpu-metrics", diagnosis: "gpufleet.io/scheduling-diagnosis",
};
const QUEUE_LABEL = "kueue.x-k8s.io/queue-name";
const KUEUE = "/apis/kueue.x-k8s.io/v1beta1";

const ann = (o, k) => ((o.metadata && o.metadata.annotations) || {})[k];
const json = (s, dflt) => { try { return s ? JSON.parse(s) : dflt; } catch { return dflt; } };
const cond = (o, type) => (((o.status || {}).conditions) || []).find((c) => c.type === type);
const nsName = (o) => `${o.metadata.namespace}/${o.metadata.name}`;
const collate = new Intl.Collator(undefined, { numeric: true }).compare; // one collator, not one a comparison
const byName = (a, b) => collate(nsName(a), nsName(b));

function age(ts) {
  if (!ts) return "";
  const s = Math.max(0, (Date.now() - Date.parse(ts)) / 1000);
  if (s < 120) return `${Math.round(s)}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  if (s < 172800) return `${Math.round(s / 3600)}h`;
  return `${Math.round(s / 86400)}d`;
}

function Problem({ error, what }) {
  if (!error) return null;
  const forbidden = error instanceof ApiError && error.status === 403;
  return <div class={`problem${forbidden ? " forbidden" : ""}`} data-testid="problem">
    {forbidden ? `Not allowed to see ${what}: ` : `Could not read ${what}: `}{error.message}
  </div>;
}

// ------------------------------------------------------------------ login

function Login({ onLogin }) {
  const [token, setToken] = useState("");
  const [namespace, setNamespace] = useState("");
  const [error, setError] = useState(null);
  async function submit(e) {
    e.preventDefault();
    session.token = token.trim();
    try {
      const review = await post("/apis/authentication.k8s.io/v1/selfsubjectreviews",
        { apiVersion: "authentication.k8s.io/v1", kind: "SelfSubjectReview" });
      session.namespace = namespace.trim();
      onLogin(review.status.userInfo);
    } catch (err) {
      session.token = "";
      setError(err.status === 401 ? "This token is not valid." : err.message);
    }
  }
  return <form class="login" onSubmit={submit}>
    <h1>gpufleet</h1>
    <p>Sign in with a bearer token: the one in your kubeconfig (<code>users[].user.token</code>) or one
      made by <code>gpufleet token create</code>. What you see is what that token may read.</p>
    <label>Token <textarea name="token" rows="3" value={token} onInput={(e) => setToken(e.target.value)} /></label>
    <label>Namespace <input name="namespace" placeholder="all namespaces" value={namespace}
      onInput={(e) => setNamespace(e.target.value)} /></label>
    {error && <div class="problem" data-testid="login-error">{error}</div>}
    <button type="submit">Sign in</button>
  </form>;
}

// ------------------------------------------------------------------ fleet

function podsByGpu(pods) {
  const out = new Map(); // node -> index -> pod
  for (const p of pods) {
    const node = (p.spec || {}).nodeName;
    const phase = (p.status || {}).phase;
    const idx = ann(p, ANN.indices);
    if (!node || !idx || phase === "Succeeded" || phase === "Failed") continue;
    let m = out.get(node);
    if (!m) out.set(node, (m = new Map()));
    for (const i of idx.split(",")) m.set(Number(i), p);
  }
  return out;
}

function useMetrics(enabled) {
  // metrics.k8s.io is not watchable (in Kubernetes neither): read it every 10 s, the first
  // time once the view's lists have come.
  const [state, setState] = useState({ byNode: new Map(), raw: new Map(), history: [] });
  const after = useAfterFirstLists();
  useEffect(() => {
    if (!enabled || !after) return undefined;
    let stopped = false;
    async function once() {
      try {
        const list = await get("/apis/metrics.k8s.io/v1beta1/nodes");
        if (stopped) return;
        setState((s) => {
          // A node whose figures did not change keeps the same array: its card is not drawn again.
          const byNode = new Map((list.items || []).map((m) => {
            const raw = ann(m, ANN.metrics) || "[]";
            const old = s.raw.get(m.metadata.name);
            return [m.metadata.name, old === raw ? s.byNode.get(m.metadata.name) : json(raw, [])];
          }));
          const raw = new Map((list.items || []).map((m) => [m.metadata.name, ann(m, ANN.metrics) || "[]"]));
          return { byNode, raw, history: [...s.history.slice(-359), [Date.now() / 1000, byNode]] };
        });
      } catch { /* metrics are optional */ }
    }
    once();
    const t = setInterval(once, 10000);
    return () => { stopped = true; clearInterval(t); };
  }, [enabled, after]);
  return state;
}

function gpuTiles(node, holders, metrics) {
  const devices = json(ann(node, ANN.gpus), []);
  const health = json(ann(node, ANN.health), {});
  const cordoned = new Set((ann(node, ANN.cordon) || "").split(",").filter(Boolean).map(Number));
  const m = new Map((metrics || []).map((g) => [g.index, g]));
  return devices.map((d) => {
    const h = health[String(d.index)] || {};
    return {
      index: d.index, model: d.model, memoryMiB: d.memoryMiB,
      healthy: (d.health || "Healthy") === "Healthy" && (!h.state || h.state === "Healthy"),
      state: h.state || d.health || "Healthy", reason: h.reason || h.message || "",
      cordoned: cordoned.has(d.index), pod: holders && holders.get(d.index), metrics: m.get(d.index),
    };
  });
}

function GpuTile({ g }) {
  const cls = ["gpu", g.pod ? "busy" : "idle", g.healthy ? "" : "unhealthy", g.cordoned ? "cordoned" : ""].join(" ");
  const mem = g.metrics && g.metrics.memoryTotalMiB
    ? `${Math.round(g.metrics.memoryUsedMiB / 1024)}/${Math.round(g.metrics.memoryTotalMiB / 1024)} GiB`
    : g.memoryMiB ? `${Math.round(g.memoryMiB / 1024)} GiB` : "";
  return <div class={cls} data-testid="gpu" data-gpu={g.index} title={g.reason || g.state}>
    <div class="gpu-head"><b>GPU {g.index}</b><span>{g.model}</span></div>
    <div class="gpu-pod" data-testid="gpu-pod">{g.pod
      ? <Link href={`/pods/${g.pod.metadata.namespace}/${g.pod.metadata.name}`}>{nsName(g.pod)}</Link>
      : <span class="muted">idle</span>}</div>
    <div class="gpu-foot">
      <span>{g.metrics ? `${Math.round(g.metrics.utilization)}%` : ""}</span><span>{mem}</span>
      <span class="state">{g.cordoned ? "fenced" : g.healthy ? "" : g.state}</span>
    </div>
  </div>;
}

function nodeState(n) {
  const ready = cond(n, "Ready");
  const out = [ready && ready.status === "True" ? "Ready" : "NotReady"];
  if ((n.spec || {}).unschedulable) out.push("cordoned");
  if (((n.spec || {}).taints || []).some((t) => t.key === "gpufleet.io/gpu-unhealthy")) out.push("gpu-unhealthy");
  return out;
}

// Who holds each GPU of a node, as a string: a card is drawn again only when it changes.
function holdersKey(holders) {
  if (!holders) return "";
  return [...holders].map(([i, p]) => `${i}=${p.metadata.uid}`).join(",");
}

// A node's card is drawn again only when its node, its GPUs' holders or its metrics change:
// a heartbeat of one node, or a pod starting on it, redraws one card of the hundreds.
class NodeCard extends Component {
  shouldComponentUpdate(next) {
    const p = this.props;
    return next.node !== p.node || next.holdersKey !== p.holdersKey || next.metrics !== p.metrics;
  }

  render({ node, holders, metrics }) {
    return nodeCard(node, holders, metrics);
  }
}

function nodeCard(node, holders, metrics) {
  const tiles = gpuTiles(node, holders, metrics);
  const states = nodeState(node);
  return <section class={`node ${states.join(" ")}`} data-testid="node" data-node={node.metadata.name}>
    <header><Link href={`/fleet/${node.metadata.name}`}>{node.metadata.name}</Link>
      {states.map((s) => <span class={`tag ${s}`}>{s}</span>)}</header>
    <div class="gpus">{tiles.map((g) => <GpuTile g={g} />)}</div>
  </section>;
}

// Nodes drawn in the first frame, more than a screen holds; the rest come in the next one, so
// the first view of a large fleet does not wait for hundreds of cards below the fold.
const FIRST_NODES = 24;

function Fleet({ name }) {
  const nodes = useList("/api/v1/nodes");
  const [drawAll, setDrawAll] = useState(false);
  useEffect(() => {
    if (!nodes.loaded || drawAll) return undefined;
    // After the frame that shows the first cards has been put on screen, not before it.
    let t = 0;
    const f = requestAnimationFrame(() => { t = setTimeout(() => setDrawAll(true), 30); });
    return () => { cancelAnimationFrame(f); clearTimeout(t); };
  }, [nodes.loaded, drawAll]);
  const pods = useList(listPath("/api/v1", "pods", session.namespace));
  const metrics = useMetrics(!nodes.error);
  const holders = useMemo(() => podsByGpu(pods.items), [pods.items]);
  const shown = (name ? nodes.items.filter((n) => n.metadata.name === name) : nodes.items)
    .sort((a, b) => collate(a.metadata.name, b.metadata.name));
  const total = shown.reduce((s, n) => s + json(ann(n, ANN.gpus), []).length, 0);
  let busy = 0;
  for (const n of shown) busy += (holders.get(n.metadata.name) || new Map()).size;
  useEffect(() => {
    if (nodes.loaded && shown.length && window.__fleetRendered === undefined) {
      window.__fleetRendered = performance.now();
      performance.mark("fleet-rendered");
    }
  });
  return <div>
    <h2>{name ? <><Link href="/fleet">Fleet</Link> / {name}</> : "Fleet"}</h2>
    <Problem error={nodes.error} what="nodes" />
    <Problem error={pods.error} what="pods" />
    {nodes.loaded && !nodes.error && <p class="summary" data-testid="fleet-summary" elementtiming="fleet">
      {shown.length} nodes, {total} GPUs, {busy} in use</p>}
    <div class="fleet">{(drawAll ? shown : shown.slice(0, FIRST_NODES)).map((n) => {
      const h = holders.get(n.metadata.name);
      return <NodeCard key={n.metadata.name} node={n} holders={h} holdersKey={holdersKey(h)}
        metrics={metrics.byNode.get(n.metadata.name)} />;
    })}</div>
    {name && shown[0] && <NodeDetail node={shown[0]} pods={pods.items} />}
  </div>;
}

function NodeDetail({ node, pods }) {
  const here = pods.filter((p) => (p.spec || {}).nodeName === node.metadata.name).sort(byName);
  return <div>
    <h3>Conditions</h3><Conditions obj={node} />
    <h3>Pods</h3><PodTable pods={here} />
    <h3>Events</h3><Events field={`involvedObject.kind=Node,involvedObject.name=${node.metadata.name}`} namespace="" />
  </div>;
}

// ------------------------------------------------------------------ workloads

// id: the kind's name in the page's URLs (batch/v1 and batch.volcano.sh both call theirs jobs).
// optional: a kind the server may not serve; its list answering 404 hides its table.
const KINDS = [
  { id: "pytorchjobs", kind: "PyTorchJob", prefix: "/apis/kubeflow.org/v1", resource: "pytorchjobs" },
  { id: "jobs", kind: "Job", prefix: "/apis/batch/v1", resource: "jobs" },
  { id: "deployments", kind: "Deployment", prefix: "/apis/apps/v1", resource: "deployments" },
  { id: "rayclusters", kind: "RayCluster", prefix: "/apis/ray.io/v1", resource: "rayclusters", optional: true },
  { id: "vcjobs", kind: "Volcano Job", prefix: "/apis/batch.volcano.sh/v1alpha1", resource: "jobs", optional: true },
];
const PT = { restarts: "gpufleet.io/gang-restarts", hardware: "gpufleet.io/hardware-restarts", attempt: "gpufleet.io/gang-attempt" };
// The reasons of the Events that restart or resize a gang (the PyTorchJob controller's, the
// Volcano Job controller's lifecycle policies, and a pod's disruption).
const RESTART_REASONS = new Set(["PyTorchJobRestarting", "GPUUnhealthy", "DeletionByTaintManager", "DeletionByPodGC",
  "Resizing", "ElasticGrow", "ElasticShrink", "Restarting", "RestartJob", "RestartTask", "PodEvicted", "BackoffLimitExceeded"]);

function ownedBy(pod, kind, name) {
  const labels = pod.metadata.labels || {};
  if (kind === "Job") return labels["batch.kubernetes.io/job-name"] === name || labels["job-name"] === name;
  if (kind === "PyTorchJob") return labels["training.kubeflow.org/job-name"] === name;
  if (kind === "RayCluster") return labels["ray.io/cluster"] === name;
  if (kind === "Volcano Job") return labels["volcano.sh/job-name"] === name;
  if (kind === "Deployment") return (pod.metadata.ownerReferences || []).some((r) => r.name.startsWith(`${name}-`));
  return false;
}

function waitReason(pods) {
  for (const p of pods) {
    const c = cond(p, "PodScheduled");
    if (c && c.status === "False") return `${c.reason}: ${c.message}`;
  }
  return "";
}

function workloadOf(wls, obj) {
  return wls.find((w) => (w.metadata.ownerReferences || []).some((r) => r.uid === obj.metadata.uid));
}

function queueWait(wl) {
  if (!wl) return "";
  const admitted = cond(wl, "Admitted");
  if (admitted && admitted.status === "True") return "";
  const q = cond(wl, "QuotaReserved") || cond(wl, "Pending");
  return q && q.status === "False" ? `queued: ${q.message || q.reason}` : (wl.spec || {}).active === false ? "deactivated" : "queued";
}

const podRestarts = (pods) => pods.reduce((s, p) => s + (((p.status || {}).containerStatuses) || [])
  .reduce((t, c) => t + (c.restartCount || 0), 0), 0);

// Restarts of the whole workload where its controller counts them (a PyTorchJob's gangs, a
// Volcano Job's retries), else its containers' restarts.
function restarts(kind, o, pods) {
  if (kind === "PyTorchJob") {
    const gang = Number(ann(o, PT.restarts) || 0);
    const hw = Number(ann(o, PT.hardware) || 0);
    return hw ? `${gang} + ${hw} off failed hardware` : String(gang + podRestarts(pods));
  }
  if (kind === "Volcano Job") return String(((o.status || {}).retryCount || 0));
  return String(podRestarts(pods));
}

function workerSpec(o) {
  const specs = (o.spec || {}).pytorchReplicaSpecs || {};
  return specs.Worker || {};
}

function size(kind, o) {
  const st = o.status || {};
  if (kind === "PyTorchJob") {
    const ep = (o.spec || {}).elasticPolicy;
    const w = workerSpec(o).replicas ?? 0;
    return ep ? `${w} Workers (elastic ${ep.minReplicas ?? 1}-${ep.maxReplicas ?? w})` : `${w} Workers`;
  }
  if (kind === "RayCluster") {
    const groups = (o.spec || {}).workerGroupSpecs || [];
    const want = st.desiredWorkerReplicas ?? groups.reduce((s, g) => s + (g.replicas ?? 0), 0);
    return `head + ${st.availableWorkerReplicas ?? 0}/${want} workers`;
  }
  if (kind === "Volcano Job") return `minAvailable ${(o.spec || {}).minAvailable ?? ""}`;
  return "";
}

function status(kind, o, pods, wl) {
  const st = o.status || {};
  const running = pods.filter((p) => (p.status || {}).phase === "Running").length;
  let phase;
  if (kind === "Deployment") phase = `${st.readyReplicas || 0}/${(o.spec || {}).replicas ?? 1} ready`;
  else if (kind === "RayCluster") phase = st.state || (running ? "Running" : "Pending");
  else if (kind === "Volcano Job") phase = (st.state || {}).phase || "Pending";
  else {
    const done = (st.conditions || []).find((c) => (c.type === "Complete" || c.type === "Succeeded" || c.type === "Failed") && c.status === "True");
    const restarting = kind === "PyTorchJob" && (cond(o, "Restarting") || {}).status === "True";
    phase = done ? done.type : (o.spec || {}).suspend ? "Suspended" : restarting ? "Restarting" : running ? "Running" : "Pending";
  }
  const gang = pods.length ? `${running}/${pods.length} pods running` : "no pods";
  const why = queueWait(wl) || (running < pods.length ? waitReason(pods) : "");
  return { phase, gang, restarts: restarts(kind, o, pods), size: size(kind, o), why };
}

function WorkloadTable({ k, list, pods, wls }) {
  if (list.error && k.optional && list.error.status === 404) return null; // not served here
  return <div>
    <h3>{k.kind}s</h3>
    {list.error ? <Problem error={list.error} what={k.resource} />
      : <table data-testid={`table-${k.id}`}>
        <thead><tr><th>Name</th><th>Status</th><th>Size</th><th>Gang</th><th>Restarts</th><th>Queue</th><th>Waiting because</th><th>Age</th></tr></thead>
        <tbody>{list.items.sort(byName).map((o) => {
          const mine = pods.items.filter((p) => p.metadata.namespace === o.metadata.namespace && ownedBy(p, k.kind, o.metadata.name));
          const s = status(k.kind, o, mine, workloadOf(wls.items, o));
          return <tr data-testid="workload" data-name={o.metadata.name} data-kind={k.id}>
            <td><Link href={`/workloads/${k.id}/${o.metadata.namespace}/${o.metadata.name}`}>{nsName(o)}</Link></td>
            <td>{s.phase}</td><td>{s.size}</td><td>{s.gang}</td><td>{s.restarts}</td>
            <td>{(o.metadata.labels || {})[QUEUE_LABEL] || ""}</td>
            <td class="why" data-testid="why">{s.why}</td><td>{age(o.metadata.creationTimestamp)}</td>
          </tr>;
        })}</tbody></table>}
  </div>;
}

function Workloads() {
  const ns = session.namespace;
  const pods = useList(listPath("/api/v1", "pods", ns));
  const wls = useList(listPath(KUEUE, "workloads", ns));
  const lists = KINDS.map((k) => ({ k, list: useList(listPath(k.prefix, k.resource, ns)) }));
  return <div>
    <h2>Workloads{ns ? ` in ${ns}` : ""}</h2>
    <Problem error={pods.error} what="pods" />
    {lists.map(({ k, list }) => <WorkloadTable k={k} list={list} pods={pods} wls={wls} />)}
  </div>;
}

const evTime = (e) => Date.parse(e.lastTimestamp || e.eventTime || e.firstTimestamp || e.metadata.creationTimestamp);
const evFirst = (e) => Date.parse(e.firstTimestamp || e.eventTime || e.lastTimestamp || e.metadata.creationTimestamp);

// An elastic PyTorchJob's Workers over time: before the page opened, from its Events (the
// automatic resizes' "Workers 2 -> 3 (min 1, max 4): ..." and a restart's "restarting with 3
// members (was 2)"), then as the page sees its spec and its running Workers.
function elasticHistory(job, events) {
  const steps = [];
  const master = ((job.spec || {}).pytorchReplicaSpecs || {}).Master ? 1 : 0;
  for (const e of events) {
    const grow = /Workers (\d+) -> (\d+)/.exec(e.message || "");
    const restart = /with (\d+) members \(was (\d+)\)/.exec(e.message || "");
    if (grow) steps.push([evFirst(e) / 1000, Number(grow[1]), Number(grow[2])]);
    else if (restart) steps.push([evFirst(e) / 1000, Number(restart[2]) - master, Number(restart[1]) - master]);
  }
  steps.sort((x, y) => x[0] - y[0]);
  const created = Date.parse(job.metadata.creationTimestamp) / 1000;
  const points = steps.length ? [[created, steps[0][1]]] : [];
  for (const [t, , to] of steps) points.push([t, to]);
  return points;
}

function ElasticChart({ job, events, pods, loaded }) {
  const running = pods.filter((p) => (p.metadata.labels || {})["training.kubeflow.org/replica-type"] === "worker"
    && (p.status || {}).phase === "Running").length;
  const seen = useSamples(() => ({ spec: workerSpec(job).replicas ?? 0, running }), 2000, loaded);
  const opened = seen.length ? seen[0][0] : Date.now() / 1000;
  const before = elasticHistory(job, events).filter(([t]) => t < opened);
  const xs = [...before.map((p) => p[0]), ...seen.map((h) => h[0])];
  const spec = [...before.map((p) => p[1]), ...seen.map((h) => h[1].spec)];
  const have = [...before.map(() => null), ...seen.map((h) => h[1].running)];
  return <div data-testid="elastic">
    <Chart title="Workers over time" series={["Workers asked for (spec; before this page, its resize events)", "Workers running"]}
      data={[xs, spec, have]} steps />
  </div>;
}

// A workload's own metrics (loss, tokens/s, ...), for its pods annotated prometheus.io/scrape:
// each node's agent scrapes them, read through the API's node proxy (GET
// /api/v1/nodes/{node}/proxy/stats/workload, what the HPA reads) every few seconds while the
// page is open; a token without nodes/proxy is told so. One chart a metric, a line a pod.
const SCRAPE_ANN = "prometheus.io/scrape";
const METRICS_EVERY_MS = 3000;
const MAX_METRIC_CHARTS = 6;

function useWorkloadMetrics(ns, pods) {
  const scraped = pods.filter((p) => String(ann(p, SCRAPE_ANN) || "").toLowerCase() === "true" && (p.spec || {}).nodeName);
  const nodes = [...new Set(scraped.map((p) => p.spec.nodeName))].sort().join(",");
  const names = scraped.map((p) => p.metadata.name).sort().join(",");
  const [state, setState] = useState({ history: [], error: null });
  useEffect(() => {
    if (!nodes) return undefined;
    const wanted = new Set(names.split(","));
    let stopped = false;
    async function once() {
      const seen = new Map();
      let error = null;
      await Promise.all(nodes.split(",").map(async (node) => {
        try {
          const r = await get(`/api/v1/nodes/${encodeURIComponent(node)}/proxy/stats/workload?namespace=${encodeURIComponent(ns)}`);
          for (const e of r.pods || []) if (wanted.has(e.name)) seen.set(e.name, e.metrics || {});
        } catch (e) { error = e; }
      }));
      if (stopped) return;
      setState((st) => ({ error, history: seen.size ? [...st.history.slice(-599), [Date.now() / 1000, seen]] : st.history }));
    }
    once();
    const t = setInterval(once, METRICS_EVERY_MS);
    return () => { stopped = true; clearInterval(t); };
  }, [ns, nodes, names]);
  return { ...state, scraped: scraped.length };
}

function WorkloadMetrics({ ns, pods }) {
  const { history, error, scraped } = useWorkloadMetrics(ns, pods);
  if (!scraped) return <p class="muted">No pod of this workload asks to be scraped (annotation <code>prometheus.io/scrape: "true"</code>).</p>;
  const metricNames = [...new Set(history.flatMap(([, m]) => [...m.values()].flatMap((x) => Object.keys(x))))].sort();
  const podNames = [...new Set(history.flatMap(([, m]) => [...m.keys()]))].sort();
  const xs = history.map((h) => h[0]);
  return <div data-testid="workload-metrics">
    <Problem error={error} what="the workload's metrics (nodes/proxy)" />
    {!error && !history.length && <p class="muted">Waiting for the first scrape of {scraped} pod(s)…</p>}
    {metricNames.slice(0, MAX_METRIC_CHARTS).map((metric) => <Chart title={metric} series={podNames}
      data={[xs, ...podNames.map((p) => history.map(([, m]) => { const v = (m.get(p) || {})[metric]; return v ?? null; }))]} />)}
    {metricNames.length > MAX_METRIC_CHARTS && <p class="muted">and {metricNames.length - MAX_METRIC_CHARTS} more: {metricNames.slice(MAX_METRIC_CHARTS).join(", ")}</p>}
  </div>;
}

function RestartTable({ o, events }) {
  const restarting = cond(o, "Restarting");
  const rows = events.filter((e) => RESTART_REASONS.has(e.reason)).sort((a, b) => evTime(b) - evTime(a));
  return <div data-testid="restarts">
    {restarting && restarting.status === "True" && <div class="pending"><b>Restarting:</b> {restarting.reason}: {restarting.message}</div>}
    {rows.length === 0 ? <p class="muted">No restarts or resizes.</p>
      : <table><thead><tr><th>Last</th><th>Reason</th><th>What happened</th><th>Count</th></tr></thead>
        <tbody>{rows.map((e) => <tr data-testid="restart" class={e.type === "Warning" ? "warning" : ""}>
          <td>{age(e.lastTimestamp || e.eventTime || e.metadata.creationTimestamp)}</td><td>{e.reason}</td>
          <td>{e.message}</td><td>{e.count || 1}</td></tr>)}</tbody></table>}
  </div>;
}

function WorkloadDetail() {
  const { resource, ns, name } = useParams();
  const k = KINDS.find((x) => x.id === resource) || KINDS[1];
  const list = useList(`${listPath(k.prefix, k.resource, ns)}?fieldSelector=metadata.name%3D${encodeURIComponent(name)}`);
  const pods = useList(listPath("/api/v1", "pods", ns));
  const wls = useList(listPath(KUEUE, "workloads", ns));
  const evs = useList(`${listPath("/api/v1", "events", ns)}?fieldSelector=${encodeURIComponent(`involvedObject.name=${name}`)}`);
  const o = list.items[0];
  const mine = pods.items.filter((p) => ownedBy(p, k.kind, name)).sort(byName);
  const s = o ? status(k.kind, o, mine, workloadOf(wls.items, o)) : null;
  const own = o ? evs.items.filter((e) => !(e.involvedObject || {}).uid || e.involvedObject.uid === o.metadata.uid) : [];
  return <div>
    <h2><Link href="/workloads">Workloads</Link> / {k.kind} {ns}/{name}</h2>
    <Problem error={list.error} what={k.resource} />
    {list.loaded && !o && !list.error && <p>Not found.</p>}
    {s && <dl class="facts"><dt>Status</dt><dd data-testid="phase">{s.phase}</dd><dt>Size</dt><dd data-testid="size">{s.size}</dd>
      <dt>Gang</dt><dd>{s.gang}</dd><dt>Restarts</dt><dd data-testid="restart-count">{s.restarts}</dd>
      <dt>Waiting because</dt><dd data-testid="why">{s.why || "—"}</dd></dl>}
    {o && k.kind === "PyTorchJob" && (o.spec || {}).elasticPolicy && <><h3>Elastic size</h3>
      <ElasticChart job={o} events={own} pods={mine} loaded={pods.loaded} /></>}
    {o && (k.kind === "PyTorchJob" || k.kind === "Volcano Job") && <><h3>Restarts and resizes</h3>
      <RestartTable o={o} events={own} /></>}
    {o && <><h3>Metrics of the workload</h3><WorkloadMetrics ns={ns} pods={mine} /></>}
    {o && <><h3>Conditions</h3><Conditions obj={o} /></>}
    <h3>Pods</h3><PodTable pods={mine} />
    <h3>Events</h3><Events field={`involvedObject.name=${name}`} namespace={ns} />
  </div>;
}

// ------------------------------------------------------------------ pods

function PodTable({ pods }) {
  return <table data-testid="pods"><thead><tr><th>Pod</th><th>Phase</th><th>Node</th><th>GPUs</th><th>Restarts</th><th>Age</th></tr></thead>
    <tbody>{pods.map((p) => <tr data-testid="pod-row" data-name={p.metadata.name}>
      <td><Link href={`/pods/${p.metadata.namespace}/${p.metadata.name}`}>{nsName(p)}</Link></td>
      <td>{(p.status || {}).phase}</td><td>{(p.spec || {}).nodeName || ""}</td><td>{ann(p, ANN.indices) || ""}</td>
      <td>{(((p.status || {}).containerStatuses) || []).reduce((t, c) => t + (c.restartCount || 0), 0)}</td>
      <td>{age(p.metadata.creationTimestamp)}</td></tr>)}</tbody></table>;
}

function Conditions({ obj }) {
  const cs = ((obj.status || {}).conditions) || [];
  return <table data-testid="conditions"><thead><tr><th>Type</th><th>Status</th><th>Reason</th><th>Message</th><th>Since</th></tr></thead>
    <tbody>{cs.map((c) => <tr><td>{c.type}</td><td>{c.status}</td><td>{c.reason || ""}</td><td>{c.message || ""}</td>
      <td>{age(c.lastTransitionTime)}</td></tr>)}</tbody></table>;
}

function Logs({ ns, name, container }) {
  const [text, setText] = useState("");
  const [error, setError] = useState(null);
  const pre = useRef(null);
  useEffect(() => {
    const ctrl = new AbortController();
    let buf = "";
    setText("");
    (async () => {
      try {
        const path = `/api/v1/namespaces/${ns}/pods/${name}/log?follow=true&tailLines=500&container=${encodeURIComponent(container)}`;
        for await (const line of lines(path, ctrl.signal)) {
          buf = (buf + line + "\n").slice(-200000);
          setText(buf);
        }
      } catch (e) { if (!ctrl.signal.aborted) setError(e); }
    })();
    return () => ctrl.abort();
  }, [ns, name, container]);
  useEffect(() => { if (pre.current) pre.current.scrollTop = pre.current.scrollHeight; }, [text]);
  return <div><Problem error={error} what="logs" /><pre class="logs" ref={pre} data-testid="logs">{text}</pre></div>;
}

function Pod() {
  const { ns, name } = useParams();
  const list = useList(`/api/v1/namespaces/${ns}/pods?fieldSelector=metadata.name%3D${encodeURIComponent(name)}`);
  const p = list.items[0];
  const containers = p ? (p.spec.containers || []).map((c) => c.name) : [];
  const [container, setContainer] = useState("");
  const c = container || containers[0];
  const scheduled = p && cond(p, "PodScheduled");
  const diagnosis = p && ann(p, ANN.diagnosis);
  const started = p && (((p.status || {}).containerStatuses) || []).some((s) => s.state && !s.state.waiting);
  return <div>
    <h2>Pod {ns}/{name}</h2>
    <Problem error={list.error} what="the pod" />
    {list.loaded && !p && !list.error && <p>Not found.</p>}
    {p && <>
      <dl class="facts"><dt>Phase</dt><dd data-testid="phase">{p.status.phase}</dd><dt>Node</dt>
        <dd>{p.spec.nodeName ? <Link href={`/fleet/${p.spec.nodeName}`}>{p.spec.nodeName}</Link> : "—"}</dd>
        <dt>GPUs</dt><dd>{ann(p, ANN.indices) || "—"}</dd></dl>
      {scheduled && scheduled.status === "False" && <div class="pending" data-testid="pending">
        <b>Waiting to be scheduled:</b> {scheduled.message}
        {diagnosis && <><h4>Per node</h4><pre data-testid="diagnosis">{diagnosis}</pre></>}
      </div>}
      <h3>Conditions</h3><Conditions obj={p} />
      <h3>Events</h3><Events field={`involvedObject.kind=Pod,involvedObject.name=${name}`} namespace={ns} />
      <h3>Logs {containers.length > 1 && <select onChange={(e) => setContainer(e.target.value)}>
        {containers.map((x) => <option selected={x === c}>{x}</option>)}</select>}</h3>
      {started ? <Logs ns={ns} name={name} container={c} /> : <p class="muted">No container has started yet.</p>}
    </>}
  </div>;
}

// ------------------------------------------------------------------ queues

function quotaRows(cq) {
  const rows = [];
  const usage = new Map();
  for (const f of ((cq.status || {}).flavorsReservation || (cq.status || {}).flavorsUsage || [])) {
    for (const r of f.resources || []) usage.set(`${f.name}/${r.name}`, r);
  }
  for (const g of ((cq.spec || {}).resourceGroups || [])) {
    for (const f of g.flavors || []) {
      for (const r of f.resources || []) {
        const u = usage.get(`${f.name}/${r.name}`) || {};
        rows.push({ flavor: f.name, resource: r.name, nominal: r.nominalQuota, borrowing: r.borrowingLimit,
          lending: r.lendingLimit, used: u.total || 0, borrowed: u.borrowed || 0 });
      }
    }
  }
  return rows;
}

function Queues() {
  const ns = session.namespace;
  const cqs = useList(`${KUEUE}/clusterqueues`);
  const lqs = useList(listPath(KUEUE, "localqueues", ns));
  const wls = useList(listPath(KUEUE, "workloads", ns));
  const pending = wls.items.filter((w) => !((cond(w, "Admitted") || {}).status === "True")
    && !((cond(w, "Finished") || {}).status === "True")).sort(byName);
  return <div>
    <h2>Queues</h2>
    <h3>ClusterQueues</h3>
    {cqs.error ? <Problem error={cqs.error} what="ClusterQueues" />
      : <table data-testid="clusterqueues"><thead><tr><th>Name</th><th>Cohort</th><th>Flavor</th><th>Resource</th>
        <th>Nominal</th><th>Used</th><th>Borrowed</th><th>Borrowing limit</th><th>Lending limit</th><th>Pending</th><th>Admitted</th></tr></thead>
        <tbody>{cqs.items.sort((a, b) => a.metadata.name.localeCompare(b.metadata.name)).flatMap((cq) =>
          quotaRows(cq).map((r, i) => <tr data-testid="clusterqueue" data-name={cq.metadata.name}>
            <td>{i === 0 ? cq.metadata.name : ""}</td><td>{i === 0 ? (cq.spec || {}).cohort || "" : ""}</td>
            <td>{r.flavor}</td><td>{r.resource}</td><td>{String(r.nominal ?? "")}</td><td>{String(r.used)}</td>
            <td>{String(r.borrowed)}</td><td>{String(r.borrowing ?? "—")}</td><td>{String(r.lending ?? "—")}</td>
            <td>{i === 0 ? (cq.status || {}).pendingWorkloads || 0 : ""}</td><td>{i === 0 ? (cq.status || {}).admittedWorkloads || 0 : ""}</td>
          </tr>))}</tbody></table>}
    <h3>LocalQueues</h3>
    <Problem error={lqs.error} what="LocalQueues" />
    <table data-testid="localqueues"><thead><tr><th>Name</th><th>ClusterQueue</th><th>Pending</th><th>Admitted</th></tr></thead>
      <tbody>{lqs.items.sort(byName).map((q) => <tr><td>{nsName(q)}</td><td>{(q.spec || {}).clusterQueue}</td>
        <td>{(q.status || {}).pendingWorkloads || 0}</td><td>{(q.status || {}).admittedWorkloads || 0}</td></tr>)}</tbody></table>
    <h3>Waiting workloads</h3>
    <Problem error={wls.error} what="Workloads" />
    <table data-testid="pending-workloads"><thead><tr><th>Workload</th><th>Queue</th><th>Why it waits</th><th>Age</th></tr></thead>
      <tbody>{pending.map((w) => <tr data-testid="pending-workload"><td>{nsName(w)}</td><td>{(w.spec || {}).queueName}</td>
        <td class="why">{queueWait(w)}</td><td>{age(w.metadata.creationTimestamp)}</td></tr>)}</tbody></table>
  </div>;
}

// ------------------------------------------------------------------ events

function Events({ field, namespace }) {
  const ns = namespace === undefined ? session.namespace : namespace;
  const q = field ? `?fieldSelector=${encodeURIComponent(field)}` : "";
  const evs = useList(listPath("/api/v1", "events", ns) + q);
  const items = evs.items.sort((a, b) => Date.parse(b.lastTimestamp || b.eventTime || b.metadata.creationTimestamp)
    - Date.parse(a.lastTimestamp || a.eventTime || a.metadata.creationTimestamp)).slice(0, 300);
  return <div><Problem error={evs.error} what="events" />
    <table data-testid="events"><thead><tr><th>Last seen</th><th>Type</th><th>Reason</th><th>Object</th><th>Message</th><th>Count</th></tr></thead>
      <tbody>{items.map((e) => <tr class={e.type === "Warning" ? "warning" : ""}>
        <td>{age(e.lastTimestamp || e.eventTime || e.metadata.creationTimestamp)}</td><td>{e.type}</td><td>{e.reason}</td>
        <td>{(e.involvedObject || {}).kind}/{e.metadata.namespace ? `${e.metadata.namespace}/` : ""}{(e.involvedObject || {}).name}</td>
        <td>{e.message}</td><td>{e.count || 1}</td></tr>)}</tbody></table></div>;
}

function EventsView() {
  return <div><h2>Events{session.namespace ? ` in ${session.namespace}` : ""}</h2><Events /></div>;
}

// ------------------------------------------------------------------ charts

// uPlot is loaded with the first chart, not with the page: the fleet view does not wait for it.
let uPlotModule = null;
const loadUPlot = () => (uPlotModule ||= import("uplot").then((m) => m.default));

// steps: each value holds until the next (a size), drawn as steps; gaps between samples spanned.
function Chart({ title, series, data, steps = false }) {
  const el = useRef(null);
  const plot = useRef(null);
  const [uPlot, setUPlot] = useState(null);
  useEffect(() => { loadUPlot().then((u) => setUPlot(() => u)); }, []);
  useEffect(() => {
    if (!el.current || !uPlot) return undefined;
    const colors = ["#3b82f6", "#ef4444", "#10b981", "#f59e0b", "#8b5cf6", "#ec4899", "#14b8a6", "#64748b"];
    plot.current = new uPlot({
      title, width: Math.min(900, el.current.clientWidth || 900), height: 240,
      series: [{}, ...series.map((s, i) => ({ label: s, stroke: colors[i % colors.length], width: 2,
        ...(steps ? { paths: uPlot.paths.stepped({ align: 1 }), spanGaps: true } : {}) }))],
      scales: { x: { time: true } }, axes: [{}, {}],
    }, data, el.current);
    return () => { if (plot.current) plot.current.destroy(); plot.current = null; };
  }, [uPlot, title, series.join("|")]);
  useEffect(() => { if (plot.current) plot.current.setData(data); }, [data]);
  return <div class="chart" ref={el} data-testid="chart" />;
}

// Samples of what the page watches, taken every few seconds while it is open.
// No sample is taken before `ready` (the lists sampled have come): no false zero at the start.
function useSamples(sample, every = 2000, ready = true) {
  const [hist, setHist] = useState([]);
  const latest = useRef(sample);
  latest.current = sample;
  useEffect(() => {
    if (!ready) return undefined;
    const take = () => setHist((h) => [...h.slice(-899), [Date.now() / 1000, latest.current()]]);
    take();
    const t = setInterval(take, every);
    return () => clearInterval(t);
  }, [ready]);
  return hist;
}

function Charts() {
  const nodes = useList("/api/v1/nodes");
  const cqs = useList(`${KUEUE}/clusterqueues`);
  const pods = useList(listPath("/api/v1", "pods", session.namespace));
  const metrics = useMetrics(!nodes.error);
  const nodeNames = nodes.items.map((n) => n.metadata.name).sort().slice(0, 8);
  const util = [metrics.history.map((h) => h[0]),
    ...nodeNames.map((n) => metrics.history.map((h) => {
      const gs = h[1].get(n) || [];
      return gs.length ? gs.reduce((s, g) => s + (g.utilization || 0), 0) / gs.length : null;
    }))];
  const cqNames = cqs.items.map((c) => c.metadata.name).sort();
  const holders = podsByGpu(pods.items);
  const hist = useSamples(() => ({
    busy: [...holders.values()].reduce((s, m) => s + m.size, 0),
    pending: new Map(cqs.items.map((c) => [c.metadata.name, (c.status || {}).pendingWorkloads || 0])),
  }), 2000, pods.loaded && cqs.loaded);
  const queues = [hist.map((h) => h[0]), ...cqNames.map((n) => hist.map((h) => h[1].pending.get(n) ?? null))];
  const busy = [hist.map((h) => h[0]), hist.map((h) => h[1].busy)];
  return <div>
    <h2>Charts</h2>
    <p class="muted">Drawn from what this page watches, since it was opened.</p>
    <Chart title="GPUs in use" series={["GPUs held by pods"]} data={busy} />
    {!nodes.error && <Chart title="GPU utilization per node (%)" series={nodeNames} data={util} />}
    {!cqs.error && cqNames.length > 0 && <Chart title="Pending workloads per ClusterQueue" series={cqNames} data={queues} />}
  </div>;
}

// ------------------------------------------------------------------ shell

function NamespacePicker() {
  const [, navigate] = useLocation();
  const nss = useList(useAfterFirstLists() ? "/api/v1/namespaces" : null);
  const [value, setValue] = useState(session.namespace);
  function choose(v) {
    session.namespace = v;
    setValue(v);
    navigate(window.location.pathname.replace(/^\/ui/, "") + (v ? `?namespace=${encodeURIComponent(v)}` : ""), { replace: false });
  }
  if (nss.error) {
    return <input class="ns" value={value} placeholder="namespace" data-testid="namespace"
      onChange={(e) => choose(e.target.value.trim())} />;
  }
  return <select class="ns" data-testid="namespace" onChange={(e) => choose(e.target.value)}>
    <option value="" selected={!value}>all namespaces</option>
    {nss.items.map((n) => n.metadata.name).sort().map((n) => <option selected={n === value}>{n}</option>)}
  </select>;
}

function Shell({ user, onLogout }) {
  const search = useSearch();
  const fromUrl = new URLSearchParams(search).get("namespace");
  if (fromUrl !== null && fromUrl !== session.namespace) session.namespace = fromUrl; // a deep link names its namespace
  const ns = session.namespace;
  const nav = [["/fleet", "Fleet"], ["/workloads", "Workloads"], ["/queues", "Queues"], ["/events", "Events"], ["/charts", "Charts"]];
  const [loc] = useLocation();
  return <div class="shell" key={ns}>
    <nav>
      <span class="brand">gpufleet</span>
      {nav.map(([href, label]) => <Link href={href} class={loc.startsWith(href) ? "active" : ""}>{label}</Link>)}
      <span class="spacer" />
      <NamespacePicker />
      <span class="user" data-testid="user">{user.username}</span>
      <button onClick={onLogout}>Sign out</button>
    </nav>
    <main>
      <Switch>
        <Route path="/fleet/:name">{(p) => <Fleet name={p.name} />}</Route>
        <Route path="/fleet"><Fleet /></Route>
        <Route path="/workloads/:resource/:ns/:name"><WorkloadDetail /></Route>
        <Route path="/workloads"><Workloads /></Route>
        <Route path="/queues"><Queues /></Route>
        <Route path="/pods/:ns/:name"><Pod /></Route>
        <Route path="/events"><EventsView /></Route>
        <Route path="/charts"><Charts /></Route>
        <Route><Redirect to="/fleet" /></Route>
      </Switch>
    </main>
  </div>;
}

function App() {
  // With a token from this tab's session the views start at once; the review only names the
  // user (or, when the token is no longer valid, signs out).
  const [user, setUser] = useState(session.token ? { username: "" } : null);
  useEffect(() => {
    if (!session.token) return;
    afterFirstLists().then(() => post("/apis/authentication.k8s.io/v1/selfsubjectreviews",
      { apiVersion: "authentication.k8s.io/v1", kind: "SelfSubjectReview" })
      .then((r) => setUser(r.status.userInfo))
      .catch((e) => { if (e.status === 401) { session.token = ""; stopAll(); setUser(null); } }));
  }, []);
  if (!user) return <Login onLogin={setUser} />;
  return <Shell user={user} onLogout={() => { session.token = ""; stopAll(); setUser(null); }} />;
}

render(<Router base="/ui"><App /></Router>, document.getElementById("app"));
