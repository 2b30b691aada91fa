"""Which failed workers the supervisor deletes itself because their pod lives on idle."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from supervisor.decide.failures import containers_run

SEQ = json.loads((Path(__file__).parent / "shapes" / "sequences" / "exit137_never.json")
                 .read_text())
RUNNING, TERMINATED = SEQ[1]["object"], SEQ[2]["object"]


def terminated_while_running() -> dict[str, Any]:
    # A real kubelet (1.34) first reports the ended container with the phase still Running;
    # the phase turns Failed once the pod is torn down.
    pod = copy.deepcopy(TERMINATED)
    pod["status"]["phase"] = "Running"
    return pod


@pytest.mark.parametrize(("pod", "idle"), [
    pytest.param(RUNNING, True, id="its container runs on: the training process died inside"),
    pytest.param(TERMINATED, False, id="its container ended: Failed"),
    pytest.param(terminated_while_running(), False,
                 id="its container ended, the phase still says Running"),
    pytest.param(SEQ[0]["object"], False, id="no container status yet"),
])
def test_only_a_pod_whose_containers_all_run_is_idle(pod: dict[str, Any], idle: bool) -> None:
    assert containers_run(pod) is idle
