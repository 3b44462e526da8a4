"""GPUs: NVML through a stand-in pynvml module (this machine has no GPU), the real NVML
fallback, declared GPUs, and what the node publishes."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field

import pytest

from gpufleet.agent import devices
from gpufleet.agent.devices import (
    DeclaredDevices,
    GPUStats,
    NoDevices,
    NoGPUs,
    NvmlDevices,
    discover,
    interconnect_groups,
    node_gpu_annotation,
    node_gpu_labels,
    normalize_model,
)

# --- a stand-in for pynvml ----------------------------------------------------------------


@dataclass
class FakeGPU:
    uuid: str
    bus: str
    name: str = "NVIDIA H100 80GB HBM3"
    mem_total: int = 81559 * 2**20
    mem_used: int = 0
    util: int = 0
    temp: int = 35
    power_mw: int = 70_000
    mig: int | None = 0  # None: not supported
    # (active, remote PCI bus id) per NVLink; None: the board has no NVLink.
    links: list[tuple[int, str]] | None = None
    switch: str = "sw0"  # PCIe switch
    lost: bool = False


@dataclass
class FakeNvml:
    gpus: list[FakeGPU]
    init_error: str | None = None
    events: list[tuple[int, int]] = field(default_factory=list)  # (gpu index, xid)
    shutdowns: int = 0

    def module(self) -> types.ModuleType:
        m = types.ModuleType("pynvml")

        class NVMLError(Exception):
            pass

        errors = {
            n: type(f"NVMLError_{n}", (NVMLError,), {})
            for n in (
                "LibraryNotFound",
                "DriverNotLoaded",
                "NotSupported",
                "GpuIsLost",
                "Timeout",
                "InvalidArgument",
            )
        }
        m.NVMLError = NVMLError
        for n, cls in errors.items():
            setattr(m, f"NVMLError_{n}", cls)
        m.NVML_FEATURE_ENABLED = 1
        m.NVML_DEVICE_MIG_ENABLE = 1
        m.NVML_TOPOLOGY_SINGLE = 10
        m.NVML_TOPOLOGY_MULTIPLE = 20
        m.NVML_TOPOLOGY_SYSTEM = 50
        m.NVML_TEMPERATURE_GPU = 0
        m.NVML_NVLINK_MAX_LINKS = 18
        m.nvmlEventTypeXidCriticalError = 8
        fake = self

        def init():
            if fake.init_error:
                raise errors[fake.init_error]("NVML Shared Library Not Found")

        def handle(i):
            if i >= len(fake.gpus):
                raise errors["InvalidArgument"]("Invalid Argument")
            if fake.gpus[i].lost:
                raise errors["GpuIsLost"]("GPU is lost")
            return fake.gpus[i]

        def mig(h):
            if h.mig is None:
                raise errors["NotSupported"]("Not Supported")
            return [h.mig, h.mig]

        def link_state(h, link):
            if h.links is None:
                raise errors["NotSupported"]("Not Supported")
            if link >= len(h.links):
                raise errors["InvalidArgument"]("Invalid Argument")
            return h.links[link][0]

        def remote_pci(h, link):
            return types.SimpleNamespace(busId=h.links[link][1].encode())

        def common_ancestor(a, b):
            return m.NVML_TOPOLOGY_SINGLE if a.switch == b.switch else m.NVML_TOPOLOGY_SYSTEM

        def event_wait(es, timeout_ms):
            if not fake.events:
                raise errors["Timeout"]("Timeout")
            i, xid = fake.events.pop(0)
            return types.SimpleNamespace(device=fake.gpus[i], eventType=8, eventData=xid)

        def shutdown():
            fake.shutdowns += 1

        m.nvmlInit = init
        m.nvmlShutdown = shutdown
        m.nvmlDeviceGetCount = lambda: len(fake.gpus)
        m.nvmlDeviceGetHandleByIndex = handle
        m.nvmlDeviceGetUUID = lambda h: h.uuid
        m.nvmlDeviceGetName = lambda h: h.name
        m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
            total=h.mem_total, used=h.mem_used, free=0
        )
        m.nvmlDeviceGetMigMode = mig
        m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=h.bus.encode())
        m.nvmlDeviceGetNvLinkState = link_state
        m.nvmlDeviceGetNvLinkRemotePciInfo = remote_pci
        m.nvmlDeviceGetTopologyCommonAncestor = common_ancestor
        m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=h.util, memory=0)
        m.nvmlDeviceGetTemperature = lambda h, sensor: h.temp
        m.nvmlDeviceGetPowerUsage = lambda h: h.power_mw
        m.nvmlEventSetCreate = lambda: object()
        m.nvmlDeviceRegisterEvents = lambda h, types_, es: None
        m.nvmlEventSetWait = event_wait
        m.nvmlEventSetFree = lambda es: None
        return m


def bus(i: int) -> str:
    return f"00000000:{0x18 + i:02X}:00.0"


@pytest.fixture
def fake_nvml(monkeypatch):
    def install(fake: FakeNvml) -> FakeNvml:
        monkeypatch.setitem(sys.modules, "pynvml", fake.module())
        return fake

    return install


def hgx(n: int = 8) -> list[FakeGPU]:
    """Every GPU linked to the NVSwitches (whose bus ids are not GPUs)."""
    return [
        FakeGPU(
            uuid=f"GPU-{i:04d}", bus=bus(i), links=[(1, f"00000000:{0xA0 + k:02X}:00.0") for k in range(4)]
        )
        for i in range(n)
    ]


# --- NVML -----------------------------------------------------------------------------------


def test_nvml_hgx_board_is_one_nvlink_domain(fake_nvml):
    fake = fake_nvml(FakeNvml(hgx()))
    nv = NvmlDevices()
    gpus = nv.fingerprint()
    assert [g.index for g in gpus] == list(range(8))
    g0 = gpus[0]
    assert (g0.uuid, g0.model, g0.memory_mib, g0.mig_mode) == ("GPU-0000", "H100-80GB-HBM3", 81559, False)
    assert {g.group for g in gpus} == {"nvlink-0"}
    assert gpus[3].nvlink_peers == [0, 1, 2, 4, 5, 6, 7]
    assert all(g.healthy for g in gpus)
    nv.close()
    assert fake.shutdowns == 1


def test_nvml_direct_pairs_and_pcie_switches(fake_nvml):
    gpus = [
        # 0-1 and 2-3 bridged in pairs (bus ids written differently, as NVML may).
        FakeGPU("GPU-a", bus(0), links=[(1, "0000:19:00.0"), (0, "")], switch="A"),
        FakeGPU("GPU-b", bus(1), links=[(1, "00000000:18:00.0")], switch="A"),
        FakeGPU("GPU-c", bus(2), links=[(1, bus(3).lower())], switch="B"),
        FakeGPU("GPU-d", bus(3), links=[(1, bus(2))], switch="B"),
        # No NVLink: 4 and 5 share a PCIe switch, 6 is alone.
        FakeGPU("GPU-e", bus(4), links=None, switch="C", mig=None),
        FakeGPU("GPU-f", bus(5), links=None, switch="C"),
        FakeGPU("GPU-g", bus(6), links=None, switch="D", mig=1, name="NVIDIA A100-SXM4-40GB"),
    ]
    fake_nvml(FakeNvml(gpus))
    got = {g.index: g for g in NvmlDevices().fingerprint()}
    assert [got[i].group for i in range(7)] == [
        "nvlink-0",
        "nvlink-0",
        "nvlink-2",
        "nvlink-2",
        "pcie-4",
        "pcie-4",
        "pcie-6",
    ]
    assert got[0].nvlink_peers == [1] and got[2].nvlink_peers == [3] and got[4].nvlink_peers == []
    assert got[4].mig_mode is None and got[6].mig_mode is True
    assert got[6].model == "A100-SXM4-40GB"


def test_nvml_lost_gpu_is_unhealthy_and_keeps_its_identity(fake_nvml):
    fake = fake_nvml(FakeNvml(hgx(4)))
    nv = NvmlDevices()
    before = nv.fingerprint()
    fake.gpus[2].lost = True
    after = nv.fingerprint()
    assert len(after) == 4
    lost = after[2]
    assert (lost.health, lost.uuid, lost.model) == ("Unhealthy", before[2].uuid, before[2].model)
    assert "lost" in lost.health_reason
    assert all(g.healthy for i, g in enumerate(after) if i != 2)
    # Still reservable by index (the scheduler decides whether to use it).
    assert nv.reserve([2])["NVIDIA_VISIBLE_DEVICES"] == before[2].uuid
    assert 2 not in nv.stats()


def test_nvml_xids_are_health_signals_not_inventory(fake_nvml):
    # What an XID means is the health policy's (tests/agent/test_gpu_health_units.py): the
    # fingerprint stays as it is, the health poll reports each XID once.
    fake = fake_nvml(FakeNvml(hgx(4), events=[(0, 13), (1, 79)]))
    nv = NvmlDevices()
    assert all(g.healthy for g in nv.fingerprint())
    sigs = nv.health_signals()
    assert [s.value for s in sigs[0]] == [13] and [s.value for s in sigs[1]] == [79]
    assert not fake.events


def test_nvml_stats(fake_nvml):
    gpus = hgx(2)
    gpus[1].util, gpus[1].mem_used, gpus[1].temp, gpus[1].power_mw = 87, 40_000 * 2**20, 71, 612_500
    fake_nvml(FakeNvml(gpus))
    stats = NvmlDevices().stats()
    assert stats[0] == GPUStats(0.0, 0, 81559, 35.0, 70.0)
    assert stats[1] == GPUStats(87.0, 40_000, 81559, 71.0, 612.5)


def test_nvml_reserve(fake_nvml):
    fake_nvml(FakeNvml(hgx(4)))
    env = NvmlDevices().reserve([1, 3])
    assert env == {
        "CUDA_VISIBLE_DEVICES": "1,3",
        "NVIDIA_VISIBLE_DEVICES": "GPU-0001,GPU-0003",
        "GPUFLEET_CDI_DEVICES": "nvidia.com/gpu=GPU-0001,nvidia.com/gpu=GPU-0003",
    }
    with pytest.raises(ValueError, match="index 9"):
        NvmlDevices().reserve([9])


@pytest.mark.parametrize("error", ["LibraryNotFound", "DriverNotLoaded"])
def test_nvml_unusable_falls_back(fake_nvml, error):
    fake_nvml(FakeNvml(hgx(), init_error=error))
    with pytest.raises(NoGPUs):
        NvmlDevices()
    assert isinstance(discover("node-1"), NoDevices)


def test_without_nvidia_ml_py_there_are_no_gpus(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(NoGPUs, match="nvidia-ml-py"):
        NvmlDevices()
    assert isinstance(discover("node-1"), NoDevices)


def test_real_nvml_on_a_machine_without_gpus():
    """The real library, where it is installed: no driver here, so LibraryNotFound."""
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py (the gpu extra) is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    with pytest.raises(NoGPUs, match="NVML is not usable"):
        NvmlDevices()
    plugin = discover("node-1")
    assert isinstance(plugin, NoDevices)
    assert plugin.fingerprint() == [] and plugin.stats() == {}
    assert plugin.reserve([]) == {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}


# --- declared -------------------------------------------------------------------------------


def test_declared_gpus():
    d = DeclaredDevices(8, "NVIDIA H100 80GB HBM3", node_name="node-1")
    gpus = d.fingerprint()
    assert [g.index for g in gpus] == list(range(8))
    assert {g.model for g in gpus} == {"H100-80GB-HBM3"}
    assert {g.memory_mib for g in gpus} == {80 * 1024}
    assert {g.group for g in gpus} == {"nvlink-0"}
    assert gpus[0].nvlink_peers == [1, 2, 3, 4, 5, 6, 7]
    assert all(g.healthy and g.uuid.startswith("GPU-") for g in gpus)
    # Deterministic per node and index, different across nodes.
    assert [g.uuid for g in gpus] == [
        g.uuid for g in DeclaredDevices(8, "H100-80GB-HBM3", node_name="node-1").fingerprint()
    ]
    other = DeclaredDevices(8, "H100-80GB-HBM3", node_name="node-2").fingerprint()
    assert not {g.uuid for g in gpus} & {g.uuid for g in other}


def test_declared_groups():
    d = DeclaredDevices(8, "A100-SXM4-40GB", group_size=4)
    assert [g.group for g in d.fingerprint()] == ["nvlink-0"] * 4 + ["nvlink-4"] * 4
    d = DeclaredDevices(2, "L4", memory_mib=23034, groups=["pcie-0", "pcie-1"])
    gpus = d.fingerprint()
    assert [g.group for g in gpus] == ["pcie-0", "pcie-1"] and gpus[0].nvlink_peers == []


def test_declared_validation_reports_every_problem():
    with pytest.raises(ValueError) as e:
        DeclaredDevices(2, "Mystery Card", groups=["a"], group_size=0)
    msg = str(e.value)
    assert "memoryMiB is required" in msg and "groups has 1 entries" in msg and "groupSize" in msg


def test_declared_from_file(tmp_path):
    f = tmp_path / "gpus.yaml"
    f.write_text("count: 4\nmodel: NVIDIA H100 80GB HBM3\nmemoryMiB: 81559\ngroupSize: 2\n")
    d = DeclaredDevices.from_file(f, node_name="n")
    assert [(g.model, g.memory_mib, g.group) for g in d.fingerprint()] == [
        ("H100-80GB-HBM3", 81559, "nvlink-0"),
        ("H100-80GB-HBM3", 81559, "nvlink-0"),
        ("H100-80GB-HBM3", 81559, "nvlink-2"),
        ("H100-80GB-HBM3", 81559, "nvlink-2"),
    ]
    f.write_text(
        "gpus:\n"
        "  - {model: H100-80GB-HBM3, memoryMiB: 81559, group: nvlink-0}\n"
        "  - {model: H100-80GB-HBM3, group: nvlink-0}\n"
        "  - {model: L4, memoryMiB: 23034, group: pcie-2}\n"
    )
    gpus = DeclaredDevices.from_file(f).fingerprint()
    assert [(g.model, g.memory_mib, g.group, g.nvlink_peers) for g in gpus] == [
        ("H100-80GB-HBM3", 81559, "nvlink-0", [1]),
        ("H100-80GB-HBM3", 80 * 1024, "nvlink-0", [0]),
        ("L4", 23034, "pcie-2", []),
    ]
    f.write_text("gpus:\n  - {memoryMiB: 1}\n  - {model: X, memoryMiB: -5}\n")
    with pytest.raises(ValueError) as e:
        DeclaredDevices.from_file(f)
    assert "gpus[0].model" in str(e.value) and "gpus[1].memoryMiB" in str(e.value)


def test_declared_stats_follow_set_busy_and_health():
    d = DeclaredDevices(4, "H100-80GB-HBM3", node_name="n")
    assert {s.utilization_pct for s in d.stats().values()} == {0.0}
    d.set_busy([1, 2], 95)
    stats = d.stats()
    assert stats[1].utilization_pct == 95 and stats[1].memory_used_mib > 0
    assert stats[0].utilization_pct == 0 and stats[0].memory_used_mib == 0
    d.set_busy([1], 0)
    assert d.stats()[1].utilization_pct == 0
    d.set_health(3, False, "XID 79")
    g3 = d.fingerprint()[3]
    assert (g3.health, g3.health_reason) == ("Unhealthy", "XID 79")
    d.set_health(3, True)
    assert d.fingerprint()[3].healthy


def test_declared_reserve():
    d = DeclaredDevices(4, "H100-80GB-HBM3", node_name="n")
    uuids = [g.uuid for g in d.fingerprint()]
    env = d.reserve([0, 2])
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{uuids[0]},{uuids[2]}"
    assert env["GPUFLEET_CDI_DEVICES"] == f"nvidia.com/gpu={uuids[0]},nvidia.com/gpu={uuids[2]}"
    with pytest.raises(ValueError):
        d.reserve([4])


def test_discover_prefers_a_declaration():
    declared = DeclaredDevices(2, "H100-80GB-HBM3")
    plugin = discover("node-7", declared)
    assert plugin is declared and declared.node_name == "node-7"


def test_declared_and_real_gpus_publish_the_same_shape(fake_nvml):
    fake_nvml(FakeNvml(hgx(8)))
    real = json.loads(node_gpu_annotation(NvmlDevices().fingerprint()))
    sim = json.loads(
        node_gpu_annotation(DeclaredDevices(8, "NVIDIA H100 80GB HBM3", memory_mib=81559).fingerprint())
    )
    strip = [{k: v for k, v in g.items() if k != "uuid"} for g in real]
    assert strip == [{k: v for k, v in g.items() if k != "uuid"} for g in sim]


# --- what the node publishes ----------------------------------------------------------------


def test_annotation_and_labels():
    d = DeclaredDevices(2, "H100-80GB-HBM3", node_name="n")
    d.set_health(1, False, "XID 48")
    gpus = d.fingerprint()
    ann = json.loads(node_gpu_annotation(gpus))
    assert ann == [
        {
            "index": 0,
            "uuid": gpus[0].uuid,
            "model": "H100-80GB-HBM3",
            "memoryMiB": 81920,
            "health": "Healthy",
            "group": "nvlink-0",
            "nvlinkPeers": [1],
        },
        {
            "index": 1,
            "uuid": gpus[1].uuid,
            "model": "H100-80GB-HBM3",
            "memoryMiB": 81920,
            "health": "Unhealthy",
            "group": "nvlink-0",
            "nvlinkPeers": [0],
            "reason": "XID 48",
        },
    ]
    assert devices.parse_node_gpu_annotation(node_gpu_annotation(gpus)) == ann
    assert node_gpu_labels(gpus) == {
        "nvidia.com/gpu.product": "H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.count": "2",
    }
    assert node_gpu_labels([]) == {}


@pytest.mark.parametrize(
    "name, label",
    [
        ("NVIDIA H100 80GB HBM3", "H100-80GB-HBM3"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("Tesla V100-SXM2-16GB", "Tesla-V100-SXM2-16GB"),
        ("NVIDIA GeForce RTX 4090", "GeForce-RTX-4090"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada-Generation"),
        ("  weird (name) / x  ", "weird-name-x"),
        ("", "unknown"),
    ],
)
def test_normalize_model(name, label):
    assert normalize_model(name) == label


def test_interconnect_groups():
    groups = interconnect_groups([0, 1, 2, 3, 4], nvlink_edges=[(1, 2)], pcie_edges=[(0, 3), (2, 4)])
    # NVLink names 1 and 2's domain; PCIe groups only what NVLink left alone.
    assert groups == {0: "pcie-0", 1: "nvlink-1", 2: "nvlink-1", 3: "pcie-0", 4: "pcie-4"}
