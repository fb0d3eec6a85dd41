"""The harness's end of the worker pipe: frames, reply validation, tensors and impossible timings."""

from __future__ import annotations

import os
import struct

import pytest
import torch
from conftest import ROOT

from dsa_bench.run import channel
from dsa_bench.run.case_context import CaseContext, implausible_timing, trial_seeds
from dsa_bench.run.protocol import ProtocolError, TimingJob, TimingResult, parse_reply, rebuild
from dsa_bench.workloads import load_workload


def pipe_with(data: bytes) -> int:
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    return read


def test_frames_round_trip_and_oversized_or_broken_frames_are_refused():
    read, write = os.pipe()
    channel.write_frame(write, {"type": "ready", "notes": "x"}, b"abc")
    assert channel.read_frame(read, 3, timeout=1) == ({"type": "ready", "notes": "x"}, b"abc")
    channel.write_frame(write, {"a": 1}, b"abcd")
    with pytest.raises(channel.ChannelError, match="more than the 3 its definition allows"):
        channel.read_frame(read, 3, timeout=1)
    with pytest.raises(channel.ChannelError, match="exceeds the limit"):
        channel.read_frame(pipe_with(struct.pack("<IQ", 2**31, 0)), 0, timeout=1)
    with pytest.raises(channel.ChannelError, match="not valid JSON"):
        channel.read_frame(pipe_with(struct.pack("<IQ", 5, 0) + b"\x80abcd"), 0, timeout=1)
    with pytest.raises(channel.ChannelError, match="NaN is not allowed"):
        channel.read_frame(pipe_with(struct.pack("<IQ", 3, 0) + b"NaN"), 0, timeout=1)
    with pytest.raises(channel.ChannelClosed):
        channel.read_frame(pipe_with(b"\x01\x00"), 0, timeout=1)
    silent, _keep_open = os.pipe()
    with pytest.raises(channel.ChannelTimeout):
        channel.read_frame(silent, 0, timeout=0.2)


def test_replies_are_validated_strictly():
    assert parse_reply({"type": "ready", "notes": ""}, ("ready",)).type == "ready"
    for header, fragment in [
        ({"type": "ready", "notes": "", "extra": 1}, "Extra inputs"),
        ({"type": "ready", "notes": 3}, "notes"),
        ({"type": "outputs", "notes": "", "sets": [{"out": {"kind": "tensor", "dtype": "int32", "shape": [-1], "in_blob": True}}]}, "sets"),
        ({"type": "shell", "notes": ""}, "type"),
        ([1, 2], "Input should be"),
    ]:
        with pytest.raises(ProtocolError, match=fragment):
            parse_reply(header, ("ready", "outputs"))
    with pytest.raises(ProtocolError, match="where ready was expected"):
        parse_reply({"type": "error", "text": "", "notes": ""}, ("ready",))


def test_tensors_are_accepted_only_as_declared_and_as_the_definition_expects():
    specs = {"out": (torch.int32, (2, 3))}
    good = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    meta = parse_reply(
        {"type": "outputs", "notes": "", "sets": [{"out": {"kind": "tensor", "dtype": "int32", "shape": [2, 3], "in_blob": True}}]},
        ("outputs",),
    ).sets[0]
    assert torch.equal(rebuild(meta, {"0/out": good}, "0/", specs, extras_allowed=True)["out"], good)
    with pytest.raises(ProtocolError, match="does not match its description"):
        rebuild(meta, {"0/out": good.float()}, "0/", specs, extras_allowed=True)
    with pytest.raises(ProtocolError, match="does not match its description"):
        rebuild(meta, {}, "0/", specs, extras_allowed=True)
    wrong_set = {
        "out": {"kind": "tensor", "dtype": "int64", "shape": [2, 3], "in_blob": False},
        "junk": {"kind": "other", "type_name": "str"},
    }
    wrong = parse_reply({"type": "outputs", "notes": "", "sets": [wrong_set]}, ("outputs",)).sets[0]
    rebuilt = rebuild(wrong, {}, "0/", specs, extras_allowed=True)
    assert rebuilt["out"].device.type == "meta" and rebuilt["out"].dtype == torch.int64 and set(rebuilt) == {"out"}
    with pytest.raises(ProtocolError, match="not among"):
        rebuild(wrong, {}, "0/", specs, extras_allowed=False)


def test_impossible_timings_are_named():
    workload = load_workload(ROOT / "workloads" / "sparse_attention_smoke.yaml")
    case = workload.cases[0]
    ctx = CaseContext(workload, case, torch.device("cpu"), workload.settings.tolerance)
    settings = workload.settings.replace(trials=1, iterations=3)
    job = TimingJob(case, trial_seeds(settings, case), 0, 3, 1)
    honest = TimingResult("cupti", samples_ms=[[0.02, 0.021, 0.02]])
    assert implausible_timing(honest, job, ctx, wall_s=1.0, copy_bytes_per_s=4e12) is None
    assert "more than the" in implausible_timing(honest, job, ctx, wall_s=1e-5, copy_bytes_per_s=4e12)
    assert "not a positive finite" in implausible_timing(TimingResult("cupti", [[0.02, float("nan"), 0.02]]), job, ctx, 1.0, 4e12)
    fake = implausible_timing(TimingResult("cupti", [[0.02, 1e-6, 0.02]]), job, ctx, 1.0, 4e12)
    assert fake is not None and "call 1 of trial 0 reported 0.001 µs" in fake, fake
