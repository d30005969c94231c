"""``recommend --patch`` writes through a descriptor of its directory, never through a link (issue 28 items
12 and 13).

The old writer checked a path and then opened it again: with a symbolic link flipped in the patch directory,
11 of 3,000 writes of ``kustomization.yaml`` landed outside it. Now each file is created under a temporary
name (``O_EXCL | O_NOFOLLOW``) relative to one descriptor of the directory and renamed over its name: a link
there is replaced, never followed, whether it was planted before or flips while the command writes. The
workloads refused for their names are listed on stderr and in the JSON.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from test_recommend import SHARE, result, row_of

from gpuagent.recommend.formats.json_doc import render_json
from gpuagent.recommend.model import WorkloadKey
from gpuagent.recommend.patches import KUSTOMIZATION, write_patches

PATCH = "serving.deployment.llm-api.yaml"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside"
    target.mkdir()
    return target


def test_links_planted_at_every_name_are_replaced_not_followed(tmp_path: Path, outside: Path) -> None:
    patches = tmp_path / "patches"
    patches.mkdir()
    for name in (PATCH, KUSTOMIZATION):
        (patches / name).symlink_to(outside / name)
    written, skipped = write_patches([row_of(SHARE)], patches)
    assert [p.file_name for p in written] == [PATCH] and skipped == []
    assert list(outside.iterdir()) == []  # nothing written where the links led
    for name in (PATCH, KUSTOMIZATION):
        assert not (patches / name).is_symlink() and (patches / name).is_file()
    assert sorted(p.name for p in patches.iterdir()) == [KUSTOMIZATION, PATCH]  # no temporary file left


def test_a_link_flipping_while_the_patches_are_written_never_leads_a_write_outside(
        tmp_path: Path, outside: Path) -> None:
    patches = tmp_path / "patches"
    patches.mkdir()
    stop = threading.Event()

    def flip() -> None:  # kustomization.yaml: a link out, then (our rename) a file, then a link again
        link = patches / ".flip"
        while not stop.is_set():
            try:
                link.symlink_to(outside / KUSTOMIZATION)
                os.replace(link, patches / KUSTOMIZATION)
            except OSError:
                pass

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    try:
        deadline = time.monotonic() + 2.0
        writes = 0
        while time.monotonic() < deadline:
            write_patches([row_of(SHARE)], patches)
            writes += 1
    finally:
        stop.set()
        flipper.join(5)
    assert writes > 20
    assert list(outside.iterdir()) == []


def test_a_file_in_place_of_the_directory_is_one_error(tmp_path: Path) -> None:
    from gpuagent.prom.errors import ReportError

    (tmp_path / "file").write_text("")
    with pytest.raises(ReportError, match="--patch: cannot write in"):
        write_patches([row_of(SHARE)], tmp_path / "file")


def test_the_json_lists_every_workload_refused_for_its_name() -> None:
    hostile = [row_of(SHARE, WorkloadKey(f"../x{i}\x1b[2J", "Deployment", "web")) for i in range(3)]
    document = json.loads(render_json(result([*hostile, row_of(SHARE)])))
    refused = document["patch_refused"]
    assert [r["namespace"] for r in refused] == ["../x0\x1b[2J", "../x1\x1b[2J", "../x2\x1b[2J"]
    assert all(r["kind"] == "Deployment" and r["name"] == "web" and "DNS-1123" in r["why"] for r in refused)
    assert json.loads(render_json(result([row_of(SHARE)])))["patch_refused"] == []
