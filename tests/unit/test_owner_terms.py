"""The terms training processes claim their workers with (hook owner.py): what a term is."""

from __future__ import annotations

import pytest

from supervisor.hook.elastic_supervisor_hook.owner import owner_file, owner_of

UID = "3f1c2a9e-5b7d-4e21-9a0c-6d8e7f1b2c3d"


@pytest.mark.parametrize(("text", "owner"), [
    (f"{UID}.0", (UID, 0)),
    (f"{UID}.12\n", (UID, 12)),
    ("none.3", ("none", 3)),  # a leader that never read its Lease's uid
    (None, None), ("", None), ("3", None), (f"{UID}.", None), (f"{UID}.-1", None),
    (f"{UID}.two", None), (".3", None), ("a/b.3", None), ("../x.3", None),
    ("x" * 65 + ".1", None),
])
def test_a_term_is_the_leases_uid_and_a_whole_number(text: str | None,
                                                    owner: tuple[str, int] | None) -> None:
    assert owner_of(text) == owner


def test_each_job_has_its_own_owner_file_unless_one_is_named() -> None:
    assert owner_file({}, UID) == f"/tmp/elastic-supervisor-owner-{UID}"
    assert owner_file({"TMPDIR": "/scratch"}, UID) == f"/scratch/elastic-supervisor-owner-{UID}"
    assert owner_file({"ELASTIC_SUPERVISOR_HOOK_OWNER_FILE": "/run/o"}, UID) == "/run/o"
