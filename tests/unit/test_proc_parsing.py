"""Pure parts of the process adapter: which ssh command line targets which host; exit codes."""

from __future__ import annotations

import pytest

from supervisor.proc import exit_code, ssh_destination

HOROVOD_SSH = ["ssh", "-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no",
               "10.1.0.10", "-p", "2222", "-i", "/keys/id",
               "cd /work >/dev/null 2>&1; env HOROVOD_HOSTNAME=10.1.0.12 python train.py"]


@pytest.mark.parametrize(("argv", "host"), [
    pytest.param(HOROVOD_SSH, "10.1.0.10", id="horovodrun's own ssh command"),
    pytest.param(["/usr/bin/ssh", "-p22", "-vT", "user@10.1.0.11", "true"], "10.1.0.11",
                 id="path, glued option value, flag cluster and user@"),
    pytest.param(["ssh", "-o", "10.1.0.10", "10.1.0.13", "cmd"], "10.1.0.13",
                 id="an option value equal to another host is not the destination"),
    pytest.param(["ssh", "--", "10.1.0.14"], "10.1.0.14", id="after --"),
    pytest.param(["ssh", "ssh://me@10.1.0.15:2222"], "10.1.0.15", id="ssh URI"),
    pytest.param(["ssh", "-p", "22"], None, id="no destination"),
    pytest.param(["sshd", "-D", "10.1.0.10"], None, id="not the ssh client"),
    pytest.param(["python", "ssh", "10.1.0.10"], None, id="ssh only as an argument"),
    pytest.param([], None, id="empty (exited process)"),
])
def test_ssh_destination(argv: list[str], host: str | None) -> None:
    assert ssh_destination(argv) == host


def test_the_host_inside_the_remote_command_does_not_count() -> None:
    assert ssh_destination(HOROVOD_SSH) != "10.1.0.12"


@pytest.mark.parametrize(("returncode", "code"), [(0, 0), (1, 1), (-9, 137), (-15, 143)])
def test_exit_code_maps_signals_like_a_shell(returncode: int, code: int) -> None:
    assert exit_code(returncode) == code
