"""The dashboard in a real browser (Debian's chromium, driven by Playwright) against a real
`gpufleet up` with two agents whose GPUs come from inventory files.

One fleet serves every check. An admin signs in with the kubeconfig's token: the fleet view
shows every GPU and the pod holding it; a job submitted while the page is open appears in
the workloads and fleet views without a reload (the page's own watch); a job too big for
any node shows the scheduler's reason and per-node diagnosis; a job over its queue's quota
shows Kueue's reason in the queues view; a pod's log is followed live. A team token sees
its own namespace and is refused another's. Last, 100 nodes of 8 GPUs are created through
the API and the fleet view's first paint of them is measured in the browser and printed.

Each view's screenshot is written to GPUFLEET_DASHBOARD_SCREENSHOTS when it is set (the
README's pictures: `GPUFLEET_DASHBOARD_SCREENSHOTS=docs/dashboard`), else to tmp_path.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import Fleet, running_fleet

from gpufleet.client.api import Client
from gpufleet.client.kubeconfig import transport_from_kubeconfig

playwright_api = pytest.importorskip("playwright.async_api")

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
NODES = ("gpu-a", "gpu-b")
GPUS_PER_NODE = 4
GPU = "nvidia.com/gpu"
KUEUE = "kueue.x-k8s.io/v1beta1"
SIM_NODES = 100
SIM_GPUS = 8
WAIT_MS = 20_000


def inventory(path: Path) -> Path:
    rows = [f"  - {{model: H100-80GB-HBM3, memoryMiB: 81920, group: nvlink-0, uuid: GPU-{path.stem}-{i}}}"
            for i in range(GPUS_PER_NODE)]
    path.write_text("gpus:\n" + "\n".join(rows) + "\n")
    return path


def job(name: str, ns: str, gpus: int, *, pods: int = 1, queue: str | None = None) -> dict:
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    script = 'i=0; while :; do echo "step $i loss $((1000 / (i + 1)))"; i=$((i + 1)); sleep 0.3; done'
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "train", "image": "localhost/gpufleet/busybox:1", "command": ["sh", "-c", script],
                            "resources": {"limits": {GPU: str(gpus)}}}]}}},
    }


def queues() -> list[dict]:
    return [
        {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": "h100"}},
        {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": "team-a"}, "spec": {
            "namespaceSelector": {}, "resourceGroups": [{"coveredResources": [GPU], "flavors": [
                {"name": "h100", "resources": [{"name": GPU, "nominalQuota": 2}]}]}]}},
        {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": "a", "namespace": "team-a"},
         "spec": {"clusterQueue": "team-a"}},
    ]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("dashboard")
    with running_fleet(root, ["up", "--no-agent", "--gateway-port", "-1"], (), gpus=0) as f:
        for name in NODES:
            f.start_agent(name, gpus=0, gpu_inventory=inventory(root / f"{name}.yaml"))
        yield f


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("GPUFLEET_DASHBOARD_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


async def browser_session(fleet: Fleet):
    pw = await playwright_api.async_playwright().start()
    if not os.access(CHROMIUM, os.X_OK):
        await pw.stop()
        pytest.fail(f"{CHROMIUM} not found: install Debian's chromium (scripts/setup.sh does)", pytrace=False)
    browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    return pw, browser


async def new_page(browser, fleet: Fleet):
    ctx = await browser.new_context(ignore_https_errors=True, viewport={"width": 1400, "height": 900})
    page = await ctx.new_page()
    # What the page logs or throws is in the test's output when a check fails.
    page.on("console", lambda m: print(f"browser console {m.type}: {m.text}"))
    page.on("pageerror", lambda e: print(f"browser error: {e}"))
    page.on("response", lambda r: r.status >= 400 and print(f"browser got {r.status} for {r.request.method} {r.url}"))
    return page


async def sign_in(page, fleet: Fleet, token: str, namespace: str = "") -> None:
    await page.goto(f"{fleet.url}/ui/")
    await page.fill("textarea[name=token]", token)
    if namespace:
        await page.fill("input[name=namespace]", namespace)
    await page.click("button[type=submit]")
    await page.wait_for_selector("[data-testid=user]", timeout=WAIT_MS)


def team_token(fleet: Fleet, ns: str) -> str:
    res = fleet.run_cli("token", "create", "--namespace", ns, "--role", "edit")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


async def pods_of(client: Client, ns: str, job_name: str) -> list[dict]:
    return [p for p in await client.list("pods", ns, raw=True)
            if p["metadata"].get("labels", {}).get("batch.kubernetes.io/job-name") == job_name]


async def test_dashboard_views_live_and_by_rbac(fleet: Fleet, shots: Path) -> None:
    client = Client(transport_from_kubeconfig(fleet.kubeconfig))
    async with client:
        await fleet.nodes_ready(client)
        for ns in ("team-a", "team-b"):
            await client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, raw=True)
        for obj in queues():
            await client.create(obj, raw=True)
        await client.create(job("train", "team-a", 2, pods=2), raw=True)
        await client.create(job("secret-b", "team-b", 1), raw=True)

        async def holding() -> bool:
            pods = [*await pods_of(client, "team-a", "train"), *await pods_of(client, "team-b", "secret-b")]
            return len(pods) == 3 and all(p["status"].get("phase") == "Running" for p in pods)
        await fleet.wait_until(holding, 40, "train and secret-b running")
        tokens = {ns: team_token(fleet, ns) for ns in ("team-a",)}

        pw, browser = await browser_session(fleet)
        try:
            page = await new_page(browser, fleet)
            # Sign in: the page's files load without a token, a wrong token is refused.
            await page.goto(f"{fleet.url}/ui/")
            await page.screenshot(path=str(shots / "login.png"))
            await page.fill("textarea[name=token]", "not-a-token")
            await page.click("button[type=submit]")
            await page.wait_for_selector("[data-testid=login-error]", timeout=WAIT_MS)
            await sign_in(page, fleet, fleet_token(fleet))
            await page.evaluate("window.__sameDocument = true")

            # Fleet: every GPU, each held one naming its pod.
            await page.wait_for_function(
                "n => document.querySelectorAll('[data-testid=gpu]').length === n", arg=len(NODES) * GPUS_PER_NODE,
                timeout=WAIT_MS)
            await page.wait_for_function(
                "() => [...document.querySelectorAll('[data-testid=gpu-pod] a')].length === 5", timeout=WAIT_MS)
            holders = await page.eval_on_selector_all("[data-testid=gpu-pod] a", "els => els.map(e => e.textContent)")
            expected = {f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                        for p in [*await pods_of(client, "team-a", "train"), *await pods_of(client, "team-b", "secret-b")]}
            assert sorted(set(holders)) == sorted(expected) and len(holders) == 5, holders
            await page.screenshot(path=str(shots / "fleet.png"), full_page=True)

            # A job submitted while the page is open: it appears without a reload.
            await page.click("nav a:text-is('Workloads')")
            await page.wait_for_selector("[data-testid=workload][data-name=train]", timeout=WAIT_MS)
            await client.create(job("late", "team-a", 1), raw=True)
            await page.wait_for_selector("[data-testid=workload][data-name=late]", timeout=WAIT_MS)
            # A job no node can hold, and one over its queue's quota: each says why it waits.
            await client.create(job("too-big", "team-a", 8), raw=True)
            await client.create(job("queued", "team-a", 4, queue="a"), raw=True)
            big_why = page.locator("[data-testid=workload][data-name=too-big] [data-testid=why]")
            await big_why.filter(has_text=GPU).wait_for(timeout=WAIT_MS)
            print("too-big waits because:", await big_why.text_content())
            queued_why = page.locator("[data-testid=workload][data-name=queued] [data-testid=why]")
            await queued_why.filter(has_text="queued").wait_for(timeout=WAIT_MS)
            await page.screenshot(path=str(shots / "workloads.png"), full_page=True)

            await page.click("nav a:text-is('Fleet')")
            await page.wait_for_function(
                "() => [...document.querySelectorAll('[data-testid=gpu-pod] a')].some(a => a.textContent.startsWith('team-a/late-'))",
                timeout=WAIT_MS)

            # Queues: nominal, used, and the workload over quota with Kueue's reason.
            await page.click("nav a:text-is('Queues')")
            pending = page.locator("[data-testid=pending-workload]", has_text="queued")
            await pending.filter(has_text=re.compile("quota|flavor", re.I)).wait_for(timeout=WAIT_MS)
            print("queued waits because:", await pending.locator(".why").text_content())
            await page.screenshot(path=str(shots / "queues.png"), full_page=True)

            # The pending pod: the scheduler's message and its per-node diagnosis (a deep link).
            big = (await pods_of(client, "team-a", "too-big"))[0]["metadata"]["name"]
            await page.goto(f"{fleet.url}/ui/pods/team-a/{big}")
            await page.locator("[data-testid=pending]").filter(has_text=GPU).wait_for(timeout=WAIT_MS)
            diagnosis = await page.locator("[data-testid=diagnosis]").text_content()
            assert all(n in diagnosis for n in NODES), diagnosis
            await page.screenshot(path=str(shots / "pod-pending.png"), full_page=True)
            await page.go_back()  # the browser's back button returns to the queues view
            await page.wait_for_selector("[data-testid=pending-workloads]", timeout=WAIT_MS)
            await page.evaluate("window.__sameDocument = true")  # from here on, no reload either

            # A running pod's log, followed live: later steps arrive while the page stays.
            train = sorted(p["metadata"]["name"] for p in await pods_of(client, "team-a", "train"))[0]
            await page.click("nav a:text-is('Fleet')")
            await page.click(f"[data-testid=gpu-pod] a:text('team-a/{train}')")
            await page.wait_for_url(f"**/ui/pods/team-a/{train}", timeout=WAIT_MS)
            logs = page.locator("[data-testid=logs]")
            await logs.filter(has_text="step").wait_for(timeout=WAIT_MS)
            first = max(int(n) for n in re.findall(r"step (\d+)", await logs.text_content()))
            await logs.filter(has_text=f"step {first + 3} ").wait_for(timeout=WAIT_MS)
            await page.screenshot(path=str(shots / "pod.png"), full_page=True)

            await page.click("nav a:text-is('Events')")
            await page.locator("[data-testid=events] tr", has_text="FailedScheduling").first.wait_for(timeout=WAIT_MS)
            await page.screenshot(path=str(shots / "events.png"), full_page=True)
            await page.click("nav a:text-is('Charts')")
            await page.wait_for_selector("[data-testid=chart] canvas", timeout=WAIT_MS)
            await asyncio.sleep(6)  # a few samples: the charts draw lines, not one point
            await page.screenshot(path=str(shots / "charts.png"), full_page=True)
            assert await page.evaluate("window.__sameDocument") is True, "the page reloaded"

            # A team's token: its namespace only.
            team = await new_page(browser, fleet)
            await sign_in(team, fleet, tokens["team-a"], namespace="team-a")
            await team.click("nav a:text-is('Workloads')")
            await team.wait_for_selector("[data-testid=workload][data-name=train]", timeout=WAIT_MS)
            await team.goto(f"{fleet.url}/ui/workloads?namespace=team-b")
            await team.locator("[data-testid=problem].forbidden").first.wait_for(timeout=WAIT_MS)
            assert "secret-b" not in await team.content()
            await team.goto(f"{fleet.url}/ui/pods/team-b/{(await pods_of(client, 'team-b', 'secret-b'))[0]['metadata']['name']}")
            await team.locator("[data-testid=problem].forbidden").first.wait_for(timeout=WAIT_MS)
            await team.goto(f"{fleet.url}/ui/fleet?namespace=team-a")
            await team.locator("[data-testid=problem].forbidden", has_text="nodes").wait_for(timeout=WAIT_MS)
        except Exception:
            for p in browser.contexts:
                for pg in p.pages:
                    print(f"--- page {pg.url} ---\n{await pg.inner_text('body')}")
            raise
        finally:
            await browser.close()
            await pw.stop()


SLEEPER = ["sh", "-c", "while :; do sleep 1; done"]
# Fails once (its first attempt), then runs: the gang restarts once, with the controller's reason.
# The mark is in the job's checkpoint directory (the agent's, under the job's uid: new each run).
FAIL_ONCE = ('d="$GPUFLEET_CHECKPOINT_DIR"; if [ ! -e "$d/failed-once" ]; then mkdir -p "$d"; '
             'touch "$d/failed-once"; echo failing once; exit 1; fi; while :; do echo step; sleep 1; done')


def container(name: str, command: list[str]) -> dict:
    return {"name": name, "image": "localhost/gpufleet/busybox:1", "command": command}


def elastic_job(ns: str) -> dict:
    worker = {"replicas": 1, "restartPolicy": "OnFailure", "template": {"spec": {
        "terminationGracePeriodSeconds": 1, "containers": [container("pytorch", ["sh", "-c", FAIL_ONCE])]}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {
        "name": "elastic", "namespace": ns, "annotations": {"gpufleet.io/elastic-autoscale": "false"}},
        "spec": {"elasticPolicy": {"minReplicas": 1, "maxReplicas": 3, "rdzvBackend": "c10d"},
                 "runPolicy": {"backoffLimit": 5}, "pytorchReplicaSpecs": {"Worker": worker}}}


# A training loop's own metrics, as Prometheus text on its port ($PORT: the process runtime's
# pods share the node's network, so the agent gives each port a host port of its own).
TRAINER = """
import http.server, os, time
start = time.time()
class Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        step = int((time.time() - start) / 0.5)
        body = (f"# TYPE train_loss gauge\\ntrain_loss {2.0 / (1 + 0.1 * step):.4f}\\n"
                f"# TYPE train_step gauge\\ntrain_step {step}\\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("0.0.0.0", int(os.environ["PORT"])), Metrics).serve_forever()
"""


def trainer_job(ns: str) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "trainer", "namespace": ns}, "spec": {
        "backoffLimit": 0, "template": {
            "metadata": {"annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "metrics"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [{
                **container("train", [sys.executable, "-c", TRAINER]),
                "ports": [{"name": "metrics", "containerPort": 9400}]}]}}}}


def ray_cluster(ns: str) -> dict:
    template = {"spec": {"containers": [container("ray", SLEEPER)]}}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "ray", "namespace": ns},
            "spec": {"headGroupSpec": {"template": template},
                     "workerGroupSpecs": [{"groupName": "cpu", "replicas": 1, "template": template}]}}


def volcano_job(ns: str) -> dict:
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "vc", "namespace": ns},
            "spec": {"minAvailable": 1, "schedulerName": "volcano", "tasks": [{"name": "main", "replicas": 1,
                     "template": {"spec": {"restartPolicy": "Never", "containers": [container("main", SLEEPER)]}}}]}}


async def test_workloads_of_every_kind_and_an_elastic_job(fleet: Fleet, shots: Path) -> None:
    """RayClusters and Volcano Jobs in the workloads view; an elastic PyTorchJob's restart with
    its reason, and its size over time as it is scaled while the page shows it."""
    client = Client(transport_from_kubeconfig(fleet.kubeconfig))
    async with client:
        await fleet.nodes_ready(client)
        ns = "research"
        await client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, raw=True)
        for obj in (elastic_job(ns), ray_cluster(ns), volcano_job(ns), trainer_job(ns)):
            await client.create(obj, raw=True)
        pw, browser = await browser_session(fleet)
        try:
            page = await new_page(browser, fleet)
            await sign_in(page, fleet, fleet_token(fleet))
            await page.click("nav a:text-is('Workloads')")
            for kind, name in (("pytorchjobs", "elastic"), ("rayclusters", "ray"), ("vcjobs", "vc")):
                await page.wait_for_selector(f"[data-testid=workload][data-kind={kind}][data-name={name}]",
                                             timeout=WAIT_MS)
            ray_row = page.locator("[data-testid=workload][data-kind=rayclusters][data-name=ray]")
            assert "head + " in await ray_row.text_content()
            await page.screenshot(path=str(shots / "workloads-kinds.png"), full_page=True)

            # The elastic job: its first attempt fails, the gang restarts, and the reason is shown.
            await page.click("[data-testid=workload][data-kind=pytorchjobs] a")
            await page.wait_for_url(f"**/ui/workloads/pytorchjobs/{ns}/elastic", timeout=WAIT_MS)
            restart = page.locator("[data-testid=restart]", has_text="PyTorchJobRestarting")
            await restart.first.wait_for(timeout=40_000)
            print("elastic restarted because:", await restart.first.text_content())
            await page.locator("[data-testid=size]", has_text="1 Workers").wait_for(timeout=WAIT_MS)
            # Scaled while the page shows it: the size follows, the chart draws it.
            await client.patch("PyTorchJob", "elastic", {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}}},
                               ns, raw=True)
            await page.locator("[data-testid=size]", has_text="2 Workers (elastic 1-3)").wait_for(timeout=WAIT_MS)
            await page.wait_for_selector("[data-testid=elastic] canvas", timeout=WAIT_MS)
            await page.wait_for_function(
                "() => [...document.querySelectorAll('[data-testid=pod-row]')].filter(r => r.textContent.includes('Running')).length === 2",
                timeout=40_000)
            await asyncio.sleep(4.5)  # two more samples of the chart at the new size
            await page.screenshot(path=str(shots / "workload-elastic.png"), full_page=True)

            # A job's own metrics, scraped by its node's agent, charted as they come.
            await page.goto(f"{fleet.url}/ui/workloads/jobs/{ns}/trainer")
            charts = page.locator("[data-testid=workload-metrics] [data-testid=chart]")
            await charts.filter(has_text="train_loss").locator("canvas").wait_for(timeout=40_000)
            await charts.filter(has_text="train_step").wait_for(timeout=WAIT_MS)
            await asyncio.sleep(7)  # a few scrapes: the loss falls
            await page.screenshot(path=str(shots / "workload-metrics.png"), full_page=True)
            # What ran here stops: the fleet is quiet again for the next test's measurement.
            await client.delete("Namespace", ns, raw=True)
        except Exception:
            for c in browser.contexts:
                for pg in c.pages:
                    print(f"--- page {pg.url} ---\n{await pg.inner_text('body')}")
            raise
        finally:
            await browser.close()
            await pw.stop()


def fleet_token(fleet: Fleet) -> str:
    import yaml

    return yaml.safe_load(Path(fleet.kubeconfig).read_text())["users"][0]["user"]["token"]


def sim_node(i: int) -> dict:
    gpus = [{"index": g, "uuid": f"GPU-sim-{i}-{g}", "model": "H100-80GB-HBM3", "memoryMiB": 81920,
             "health": "Healthy", "group": "nvlink-0"} for g in range(SIM_GPUS)]
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": f"sim-{i:03d}", "labels": {"nvidia.com/gpu.product": "H100-80GB-HBM3"},
        "annotations": {"gpufleet.io/gpus": json.dumps(gpus)}},
        "status": {"capacity": {GPU: str(SIM_GPUS)}, "allocatable": {GPU: str(SIM_GPUS)}}}


async def test_first_view_of_800_gpus(fleet: Fleet, shots: Path) -> None:
    client = Client(transport_from_kubeconfig(fleet.kubeconfig))
    async with client:
        sem = asyncio.Semaphore(16)

        async def make(i: int) -> None:
            async with sem:
                await client.create(sim_node(i), raw=True)
        await asyncio.gather(*(make(i) for i in range(SIM_NODES)))
        total = len(await client.list("Node", raw=True))
        gpus = SIM_NODES * SIM_GPUS + len(NODES) * GPUS_PER_NODE
    pw, browser = await browser_session(fleet)
    try:
        # Each load is a new browser context (a new connection, nothing cached): a user opening
        # the dashboard. The first is printed on its own; the three together show the spread.
        figures = []
        for n in range(VIEW_LOADS):
            page = await new_page(browser, fleet)
            figures.append(await first_view(page, fleet, gpus))
            if n == VIEW_LOADS - 1:
                await page.screenshot(path=str(shots / "fleet-800.png"))
            await page.context.close()
        for n, f in enumerate(figures):
            print(f"fleet view of {total} nodes / {gpus} GPUs, load {n + 1}: first view painted "
                  f"{f['painted']:.0f} ms after navigation (drawn {f['drawn']:.0f} ms; lists asked at "
                  f"{f['nodesStart']:.0f} ms, answered at {f['nodesEnd']:.0f} ms; every tile present at "
                  f"{f['tiles']:.0f} ms; from the answer to the paint {f['painted'] - f['nodesEnd']:.0f} ms)")
        painted = sorted(f["painted"] for f in figures)
        print(f"fleet view first paint over {VIEW_LOADS} loads: median {painted[len(painted) // 2]:.0f} ms, "
              f"min {painted[0]:.0f} ms, max {painted[-1]:.0f} ms")
    finally:
        await browser.close()
        await pw.stop()


VIEW_LOADS = 3

# When the browser painted the fleet summary (Element Timing: the summary is drawn in the
# same frame as the first cards), when the view's effect ran, and when the node list came.
FIRST_VIEW = """() => new Promise((done) => new PerformanceObserver((list) => {
  const e = list.getEntries().find((x) => x.identifier === "fleet");
  const nodes = performance.getEntriesByType("resource").find((r) => new URL(r.name).pathname === "/api/v1/nodes");
  done({ painted: e ? e.renderTime : NaN, drawn: window.__fleetRendered,
         nodesStart: nodes ? nodes.startTime : NaN, nodesEnd: nodes ? nodes.responseEnd : NaN });
}).observe({ type: "element", buffered: true }))"""


async def first_view(page, fleet: Fleet, gpus: int) -> dict:
    await page.add_init_script(f"sessionStorage.setItem('gpufleet.token', {json.dumps(fleet_token(fleet))})")
    await page.goto(f"{fleet.url}/ui/fleet")
    await page.wait_for_function("n => document.querySelectorAll('[data-testid=gpu]').length === n",
                                 arg=gpus, timeout=WAIT_MS)
    tiles = await page.evaluate("performance.now()")
    summary = await page.text_content("[data-testid=fleet-summary]")
    assert f"{gpus} GPUs" in summary, summary
    return {**await page.evaluate(FIRST_VIEW), "tiles": tiles}
