"""GPU health without a control plane: the policy table, the agent's health state machine,
the declared inventory re-read, and the NVML poller against a fake pynvml."""

from __future__ import annotations

import os
import types

import pytest
from test_devices import FakeNvml, hgx

from gpufleet.agent.devices import DeclaredDevices, NvmlDevices
from gpufleet.agent.gpuhealth import HealthTracker
from gpufleet.api.gpuhealth import (
    DEFAULT_POLICY,
    DRAIN_GPU,
    DRAIN_NODE,
    ECC_AGGREGATE,
    ECC_VOLATILE,
    GPU_LOST,
    IGNORE,
    NVLINK_ERRORS,
    REMAPPED_ROWS_FAILED,
    THROTTLE,
    WARN,
    XID,
    Signal,
    action_for,
    parse_policy,
    worst,
)

# -- the policy table ---------------------------------------------------------------------------


@pytest.mark.parametrize("xid", [48, 63, 64, 74, 79, 94, 95, 119, 120, 140])
def test_hardware_xids_drain_the_gpu(xid):
    assert action_for(Signal(XID, xid)) == DRAIN_GPU


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68])
def test_application_xids_are_ignored(xid):
    assert action_for(Signal(XID, xid)) == IGNORE


def test_other_signals_and_unknown_xids():
    assert action_for(Signal(XID, 92)) == WARN
    assert action_for(Signal(XID, 9999)) == WARN  # unknown: not evidence enough to stop a job
    assert action_for(Signal(THROTTLE, 1, "hw-thermal")) == WARN
    assert action_for(Signal(GPU_LOST, 1)) == DRAIN_GPU
    assert action_for(Signal(ECC_VOLATILE, 2)) == DRAIN_GPU
    assert action_for(Signal(ECC_AGGREGATE, 2)) == WARN
    assert action_for(Signal(REMAPPED_ROWS_FAILED, 1)) == DRAIN_GPU
    assert action_for(Signal(NVLINK_ERRORS, 5)) == WARN
    assert action_for(Signal(NVLINK_ERRORS, 100)) == DRAIN_GPU
    assert worst([Signal(THROTTLE, 1), Signal(XID, 79), Signal(XID, 13)]) == (DRAIN_GPU, Signal(XID, 79))
    assert worst([]) == (IGNORE, None)


def test_policy_overrides_and_their_errors():
    p = parse_policy("xid:79=drain-node, xid:13=warn, throttle=ignore, nvlink-threshold=5, xid:unknown=ignore")
    assert action_for(Signal(XID, 79), p) == DRAIN_NODE
    assert action_for(Signal(XID, 13), p) == WARN
    assert action_for(Signal(XID, 4242), p) == IGNORE
    assert action_for(Signal(THROTTLE, 1), p) == IGNORE
    assert action_for(Signal(NVLINK_ERRORS, 5), p) == DRAIN_GPU
    assert action_for(Signal(XID, 48), p) == DRAIN_GPU  # the rest of the table stays
    for bad, words in [("xid:79=reboot", "action must be one of"), ("xid:x=warn", "XID must be a number"),
                       ("fan=warn", "the key must be"), ("nvlink-threshold=0", "positive integer"),
                       ("xid:79", "not key=value")]:
        with pytest.raises(ValueError, match=words):
            parse_policy(bad)


# -- the state machine -------------------------------------------------------------------------


def tracker(**kw) -> HealthTracker:
    return HealthTracker(DEFAULT_POLICY, failure_limit=3, failure_window=3600, validation_backoff=10, **kw)


UUIDS = {0: "GPU-a", 1: "GPU-b"}


def test_fence_validate_return():
    t = tracker()
    changes = t.observe({1: [Signal(XID, 79)]}, UUIDS, set(), 100.0)
    assert [(c.kind, c.index, c.evict) for c in changes] == [("fence", 1, True)]
    assert "GPU 1 (GPU-b): XID 79" in changes[0].message
    assert t.fenced() == {1}
    assert t.condition()[:2] == ("False", "XID79")
    # The XID persists (a declared inventory): no second fence, no validation yet.
    assert t.observe({1: [Signal(XID, 79)]}, UUIDS, set(), 101.0) == []
    assert t.due_for_validation(101.0) == []
    assert t.gpus[1].xid_counts[79] == 1
    # It clears: validated, back.
    t.observe({1: []}, UUIDS, set(), 102.0)
    assert t.due_for_validation(102.0) == [1]
    changes = t.validated(1, True, "ok", 103.0)
    assert [c.kind for c in changes] == ["returned"]
    assert t.fenced() == set()
    assert t.condition()[0] == "True"
    assert [h["event"] for h in t.gpus[1].history] == ["Unhealthy", "Healthy"]


def test_a_check_that_passes_while_the_gpu_fails_again_does_not_return_it():
    t = tracker()
    t.observe({1: [Signal(XID, 79)]}, UUIDS, set(), 1.0)
    t.observe({1: []}, UUIDS, set(), 2.0)
    assert t.due_for_validation(2.0) == [1]
    t.gpus[1].validating = True
    t.observe({1: [Signal(ECC_VOLATILE, 1)]}, UUIDS, set(), 3.0)
    assert t.validated(1, True, "ok", 4.0) == []
    assert t.fenced() == {1} and t.gpus[1].reason == "ECCUncorrectable"


def test_fences_survive_an_agent_restart_through_the_annotation():
    from gpufleet.api.gpuhealth import parse_health_annotation

    t = tracker()
    t.observe({0: [Signal(XID, 119)], 1: [Signal(XID, 79)]}, UUIDS, set(), 1.0)
    t.observe({0: [], 1: []}, UUIDS, set(), 2.0)
    t.validated(1, False, "exit code 1", 3.0)
    t.validated(1, False, "exit code 1", 20.0)  # the third failure: held
    record = parse_health_annotation(t.annotation())
    assert (record["0"]["state"], record["1"]["state"]) == ("Fenced", "Held")

    again = tracker()
    # A GPU that was swapped (another UUID) starts clean.
    assert again.restore(record, {0: "GPU-a", 1: "GPU-b", 2: "GPU-c"}) == [0, 1]
    assert again.fenced() == {0, 1} and again.held() == {1}
    assert again.gpus[0].reason == "XID119" and again.gpus[1].xid_counts[79] == 1
    # The XID is long gone, but the GPU comes back only through a validation; what the device
    # still reports after the restart is not a new failure.
    assert again.observe({0: [], 1: [Signal(XID, 79)]}, UUIDS, {1}, 30.0) == []
    assert again.due_for_validation(30.0) == [0]
    assert again.gpus[1].failures == []
    assert list(again.gpus[0].history) == record["0"]["history"]  # the history carries over


def test_application_xid_and_warnings_do_not_fence():
    t = tracker()
    changes = t.observe({0: [Signal(XID, 13), Signal(THROTTLE, 1, "hw-thermal")]}, UUIDS, set(), 1.0)
    assert [c.kind for c in changes] == ["warn"]
    assert t.fenced() == set()
    # Told once, not every poll.
    assert t.observe({0: [Signal(THROTTLE, 1, "hw-thermal")]}, UUIDS, set(), 2.0) == []


def test_three_failures_in_the_window_hold_the_gpu_until_uncordoned():
    t = tracker()
    t.observe({0: [Signal(XID, 48)]}, UUIDS, set(), 0.0)
    t.observe({0: []}, UUIDS, set(), 1.0)
    assert [c.kind for c in t.validated(0, False, "exit code 1", 2.0)] == ["validation-failed"]
    assert t.due_for_validation(5.0) == []  # backoff
    assert t.due_for_validation(12.0) == [0]
    kinds = [c.kind for c in t.validated(0, False, "exit code 1", 12.0)]
    assert kinds == ["validation-failed", "held"]
    assert t.gpus[0].held and t.gpus[0].cordoned
    assert t.due_for_validation(1000.0) == []
    assert t.condition()[1] == "RepeatedFailures"
    # The agent writes it into the cordon annotation; the operator takes it out again.
    t.observe({0: []}, UUIDS, {0}, 20.0)
    assert t.gpus[0].held
    t.observe({0: []}, UUIDS, set(), 21.0)
    assert not t.gpus[0].held and t.gpus[0].failures == []
    assert t.due_for_validation(21.0) == [0]
    assert [c.kind for c in t.validated(0, True, "", 22.0)] == ["returned"]


def test_failures_outside_the_window_are_forgotten():
    t = tracker()
    for n in range(4):
        now = n * 4000.0
        t.observe({0: [Signal(XID, 79)]}, UUIDS, set(), now)
        t.observe({0: []}, UUIDS, set(), now + 1)
        t.validated(0, True, "", now + 2)
    assert not t.gpus[0].held


def test_operator_cordon_and_unknown_node():
    t = tracker()
    changes = t.observe({}, UUIDS, {1}, 1.0)
    assert [(c.kind, c.index, c.evict) for c in changes] == [("fence", 1, False)]
    assert t.condition()[1] == "OperatorCordon"
    assert t.observe({}, UUIDS, None, 2.0) == []  # the node is not known this poll: nothing changes
    assert t.fenced() == {1}
    assert [c.kind for c in t.observe({}, UUIDS, set(), 3.0)] == ["returned"]


def test_drain_node_fences_every_gpu():
    t = HealthTracker(parse_policy("xid:79=drain-node"))
    changes = t.observe({0: [Signal(XID, 79)]}, UUIDS, set(), 1.0)
    assert sorted(c.index for c in changes if c.kind == "fence") == [0, 1]
    assert t.fenced() == {0, 1}


# -- the declared inventory --------------------------------------------------------------------


def write(path, text: str, tick: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(tick * 10**9, tick * 10**9))


def test_inventory_is_read_again_when_it_changes(tmp_path):
    inv = tmp_path / "gpus.yaml"
    write(inv, "gpus:\n  - {model: H100-80GB-HBM3}\n  - {model: H100-80GB-HBM3}\n", 1)
    d = DeclaredDevices.from_file(inv, "n1")
    assert d.health_signals() == {0: [], 1: []}
    write(inv, "gpus:\n  - {model: H100-80GB-HBM3, xid: [79, 13], ecc: {volatile: 2, aggregate: 5}}\n"
               "  - {model: H100-80GB-HBM3, health: unhealthy, nvlinkErrors: 7, throttle: hw-thermal,"
               " remappedRowsFailed: true}\n", 2)
    sigs = d.health_signals()
    assert sigs[0] == [Signal(XID, 79), Signal(XID, 13), Signal(ECC_VOLATILE, 2), Signal(ECC_AGGREGATE, 5)]
    assert {s.kind for s in sigs[1]} == {"declared-unhealthy", NVLINK_ERRORS, THROTTLE, REMAPPED_ROWS_FAILED}
    # A broken file keeps what was read before.
    write(inv, "gpus:\n  - {model: H100-80GB-HBM3, xid: lots}\n", 3)
    assert d.health_signals()[0][0] == Signal(XID, 79)
    write(inv, "gpus:\n  - {model: H100-80GB-HBM3}\n  - {model: H100-80GB-HBM3, health: healthy}\n", 4)
    assert d.health_signals() == {0: [], 1: []}


def test_inventory_health_fields_are_checked(tmp_path):
    inv = tmp_path / "gpus.yaml"
    inv.write_text("gpus:\n  - {model: H100-80GB-HBM3, health: sick, xid: -1, nvlinkErrors: many}\n")
    with pytest.raises(ValueError) as e:
        DeclaredDevices.from_file(inv)
    for words in ("gpus[0].health must be healthy or unhealthy", "gpus[0].xid must be a positive integer",
                  "gpus[0].nvlinkErrors must be a non-negative integer"):
        assert words in str(e.value)


# -- NVML ----------------------------------------------------------------------------------------


class HealthNvml(FakeNvml):
    """The fake NVML of test_devices with the health calls: per GPU ECC counts, remapped rows,
    NVLink error counters and throttle reasons."""

    def __init__(self, gpus, **kw) -> None:
        super().__init__(gpus, **kw)
        self.ecc: dict[int, tuple[int, int]] = {}
        self.remap: dict[int, tuple[int, int, int, int]] = {}
        self.nvlink: dict[int, int] = {}
        self.throttle: dict[int, int] = {}

    def module(self) -> types.ModuleType:
        m = super().module()
        fake = self
        m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, m.NVML_VOLATILE_ECC, m.NVML_AGGREGATE_ECC = 1, 0, 1
        m.NVML_NVLINK_ERROR_DL_REPLAY, m.NVML_NVLINK_ERROR_DL_RECOVERY = 0, 1
        m.NVML_ERROR_GPU_IS_LOST = 15
        m.nvmlClocksThrottleReasonHwThermalSlowdown = 0x40

        def index(h):
            return fake.gpus.index(h)

        def ecc(h, kind, counter):
            vol, agg = fake.ecc.get(index(h), (0, 0))
            return vol if counter == 0 else agg

        def remapped(h):
            if index(h) == 3:
                raise m.NVMLError_NotSupported("Not Supported")
            return fake.remap.get(index(h), (0, 0, 0, 0))

        def nvlink_errors(h, link, counter):
            return fake.nvlink.get(index(h), 0) if link == 0 and counter == 0 else 0

        m.nvmlDeviceGetTotalEccErrors = ecc
        m.nvmlDeviceGetRemappedRows = remapped
        m.nvmlDeviceGetNvLinkErrorCounter = nvlink_errors
        m.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: fake.throttle.get(index(h), 0)
        return m


def test_nvml_health_poll(monkeypatch):
    import sys

    gpus = hgx(4)
    for g in gpus:
        g.links = [(1, "00000000:99:00.0")]  # one active link, to a switch
    fake = HealthNvml(gpus, events=[(0, 13), (1, 79)])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    nv = NvmlDevices()
    fake.nvlink[0] = 40  # errors from before the agent watched: not counted
    first = nv.health_signals()
    assert (first[0], first[1]) == ([Signal(XID, 13)], [Signal(XID, 79)])
    fake.ecc[2] = (3, 7)
    fake.remap[1] = (0, 1, 0, 1)
    fake.nvlink[0] = 290
    fake.throttle[2] = 0x40
    sigs = nv.health_signals()
    assert sigs[0] == [Signal(NVLINK_ERRORS, 250)]
    assert sigs[1] == [Signal(REMAPPED_ROWS_FAILED, 1)]
    assert sigs[2] == [Signal(ECC_VOLATILE, 3), Signal(ECC_AGGREGATE, 7), Signal(THROTTLE, 1, "hw-thermal")]
    assert sigs[3] == []  # no remapping support: the rest is still read
    # XIDs are events: read once (the first poll had them). A GPU that falls off the bus is
    # reported lost.
    gpus[3].lost = True
    sigs = nv.health_signals()
    assert Signal(XID, 79) not in sigs[1]
    assert [s.kind for s in sigs[3]] == [GPU_LOST]
    # Through the state machine: 0 drains for NVLink errors over the threshold, 1 for its failed
    # row remapping,
    # 2 for its volatile ECC errors, 3 for being lost.
    t = tracker()
    t.observe(sigs, {i: f"GPU-{i}" for i in range(4)}, set(), 1.0)
    assert t.fenced() == {0, 1, 2, 3}


def test_agent_flags_refuse_a_bad_policy_naming_the_flag():
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    r = CliRunner().invoke(app, ["agent", "--gpus", "1", "--gpu-health-policy", "xid:79=reboot"])
    assert r.exit_code == 2 and "--gpu-health-policy" in r.output and "action must be one of" in r.output
    r = CliRunner().invoke(app, ["agent", "--gpus", "1", "--gpu-failure-window", "soon"])
    assert r.exit_code == 2 and "--gpu-failure-window" in r.output
