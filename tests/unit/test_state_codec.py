"""The state ConfigMap's encoding (kube.encode_state, kube.stored_text): a small state stays
readable under data state.json; a large one (10,000 slots) is stored gzip-compressed under
binaryData state.json.gz, well inside a ConfigMap's 1 MiB; what cannot be read is Damaged with
one line naming the ConfigMap and the key, never read as nothing stored (that would reset the
restart budgets)."""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import replace

import pytest

from supervisor import kube
from supervisor.decide import fleet

WHERE = "configmap team-a/job1-supervisor-state: state.json"


def big_state(n: int = 10_000) -> dict[str, object]:
    """n slots that each failed once or twice, half with a node to avoid and a backoff: the
    shape fleet_to_dict writes at 10,000 workers after a wave of failures."""
    f = fleet.initial(n)
    f = replace(f, slots={i: replace(s, incarnation=2 + i % 2, due=1_764_553_000.0 + i / 7,
                                     avoid_node=f"ip-10-0-{i % 200}-{i % 97}.ec2.internal"
                                     if i % 2 else None)
                          for i, s in f.slots.items()})
    return fleet.fleet_to_dict(f)


def cm_of(fields: dict[str, dict[str, str]]) -> dict[str, object]:
    return {"metadata": {"name": "job1-supervisor-state"}, **fields}


def test_a_small_state_stays_plain_json_under_data() -> None:
    state = fleet.fleet_to_dict(fleet.initial(3))
    fields = kube.encode_state(state, "state.json")
    assert list(fields) == ["data"] and list(fields["data"]) == ["state.json"]
    assert json.loads(fields["data"]["state.json"]) == state
    assert json.loads(kube.stored_text(cm_of(fields), "state.json", WHERE) or "") == state


def test_ten_thousand_slots_are_stored_compressed_well_inside_a_configmap() -> None:
    state = big_state()
    plain = len(json.dumps(state, sort_keys=True))
    fields = kube.encode_state(state, "state.json")
    assert list(fields) == ["binaryData"] and list(fields["binaryData"]) == ["state.json.gz"]
    stored = len(fields["binaryData"]["state.json.gz"])
    assert plain > 700_000  # two thirds of a ConfigMap's 1,048,576 bytes as plain JSON
    assert stored < plain / 4, (stored, plain)
    assert json.loads(kube.stored_text(cm_of(fields), "state.json", WHERE) or "") == state
    # The same state gives the same bytes (no timestamp in the gzip header).
    assert kube.encode_state(state, "state.json") == fields


def test_nothing_stored_is_none() -> None:
    assert kube.stored_text(cm_of({}), "state.json", WHERE) is None
    assert kube.stored_text(cm_of({"data": {"other": "x"}}), "state.json", WHERE) is None


def packed(raw: bytes) -> str:
    return base64.b64encode(gzip.compress(raw, mtime=0)).decode()


FIX = "; fix or delete it deliberately"


@pytest.mark.parametrize(("fields", "message"), [
    pytest.param({"data": {"state.json": "{}"}, "binaryData": {"state.json.gz": packed(b"{}")}},
                 f"{WHERE} holds both data state.json and binaryData state.json.gz; keep the "
                 "one the supervisor wrote last, or delete the ConfigMap deliberately",
                 id="both kept"),
    pytest.param({"binaryData": {"state.json.gz": base64.b64encode(b"{}").decode()}},
                 f"{WHERE}.gz is not gzip-compressed JSON (Error -3 while decompressing data: "
                 f"incorrect header check){FIX}", id="not gzip"),
    pytest.param({"binaryData": {"state.json.gz": base64.b64encode(
        gzip.compress(b'{"version": 1}', mtime=0)[:-8]).decode()}},
                 f"{WHERE}.gz is not gzip-compressed JSON (the gzip stream is cut short){FIX}",
                 id="cut short"),
    pytest.param({"binaryData": {"state.json.gz": base64.b64encode(gzip.compress(
        b" " * (kube.INFLATED_MAX_BYTES + 1), compresslevel=1, mtime=0)).decode()}},
                 f"{WHERE}.gz is not gzip-compressed JSON (it inflates to more than "
                 f"{kube.INFLATED_MAX_BYTES} bytes){FIX}", id="a bomb"),
    pytest.param({"binaryData": {"state.json.gz": "!!not base64!!"}},
                 f"{WHERE}.gz is not gzip-compressed JSON (Only base64 data is allowed){FIX}",
                 id="not base64"),
])
def test_a_state_that_cannot_be_read_is_damaged_with_one_line(
        fields: dict[str, dict[str, str]], message: str) -> None:
    with pytest.raises(kube.Damaged) as err:
        kube.stored_text(cm_of(fields), "state.json", WHERE)
    assert str(err.value) == message
    assert not err.value.retryable


def test_compressed_text_that_is_not_a_state_is_damaged_as_plain_text_is() -> None:
    fields = {"binaryData": {"state.json.gz": packed(b"[1, 2]" + b" " * 70_000)}}
    raw = kube.stored_text(cm_of(fields), "state.json", WHERE) or ""
    with pytest.raises(kube.Damaged, match=r"state\.json is not a JSON object \(an array"):
        kube.decode_state(raw, WHERE)


def test_slots_kept_as_json_text_are_stored_as_the_same_bytes() -> None:
    """The state as core.state_of hands it over (fleet.stored): its slots a model.JsonText
    joined from a text per slot (fleet.stored_slots). Stored, it is byte for byte what
    json.dumps of the slots as a mapping gives, small and large; a mark that collides with
    another value of the state still gives the same bytes."""
    for state in (fleet.fleet_to_dict(fleet.initial(3)), big_state()):
        f = fleet.fleet_from_dict(state)
        assert fleet.stored_slots(f) == json.dumps(state["slots"], sort_keys=True)
        as_text = {**fleet.stored(f), "restartLimit": 5}  # as core.state_of makes it
        assert kube.state_text(as_text) == json.dumps({**state, "restartLimit": 5},
                                                      sort_keys=True)
        assert kube.encode_state(as_text, "state.json") == kube.encode_state(
            {**state, "restartLimit": 5}, "state.json")
    state = fleet.fleet_to_dict(fleet.initial(2))
    taken = {**state, "slots": fleet.stored_slots(fleet.initial(2)),
             "writer": "\x00JsonText slots\x00"}
    assert kube.state_text(taken) == json.dumps(
        {**state, "writer": "\x00JsonText slots\x00"}, sort_keys=True)
