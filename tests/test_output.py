from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar.errors import InvalidRequest, OutputExists
from sidecar.pipeline.output.files import FileTarget


@pytest.mark.parametrize(
    "bad", ["", "../x.mp4", "a/../../x.mp4", "/etc/passwd", "a/\x00b.mp4", "dir/", "x" * 2000]
)
def test_rejects_paths_that_escape(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InvalidRequest, match=r"output\.file\.path"):
        FileTarget.prepare(tmp_path, bad, overwrite=False)


def test_creates_directories_and_commits_atomically(tmp_path: Path) -> None:
    target = FileTarget.prepare(tmp_path, "a/b/c.mp4", overwrite=False)
    temp = target.open_temp()
    assert temp.parent == tmp_path / "a" / "b" and temp.name.startswith(".c.mp4.")
    temp.write_bytes(b"data")
    assert not (tmp_path / "a/b/c.mp4").exists()
    assert target.commit() == tmp_path / "a/b/c.mp4"
    assert (tmp_path / "a/b/c.mp4").read_bytes() == b"data"
    assert os.listdir(tmp_path / "a/b") == ["c.mp4"]


def test_existing_file_is_never_clobbered(tmp_path: Path) -> None:
    (tmp_path / "x.mp4").write_bytes(b"old")
    with pytest.raises(OutputExists):
        FileTarget.prepare(tmp_path, "x.mp4", overwrite=False)
    # Appearing while encoding is caught at commit time too.
    target = FileTarget.prepare(tmp_path, "y.mp4", overwrite=False)
    target.open_temp().write_bytes(b"new")
    (tmp_path / "y.mp4").write_bytes(b"other")
    with pytest.raises(OutputExists):
        target.commit()
    assert (tmp_path / "y.mp4").read_bytes() == b"other"
    assert sorted(os.listdir(tmp_path)) == ["x.mp4", "y.mp4"]


def test_overwrite(tmp_path: Path) -> None:
    (tmp_path / "x.mp4").write_bytes(b"old")
    target = FileTarget.prepare(tmp_path, "x.mp4", overwrite=True)
    target.open_temp().write_bytes(b"new")
    target.commit()
    assert (tmp_path / "x.mp4").read_bytes() == b"new"


def test_symlinked_directory_outside_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    with pytest.raises(InvalidRequest, match="link"):
        FileTarget.prepare(root, "escape/sub/x.mp4", overwrite=False)
    assert list(outside.iterdir()) == []


def test_symlink_inside_root_is_fine(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    target = FileTarget.prepare(tmp_path, "alias/x.mp4", overwrite=False)
    assert target.final == tmp_path / "real" / "x.mp4"


def test_final_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    root = tmp_path / "root"
    root.mkdir()
    (root / "x.mp4").symlink_to(victim)
    target = FileTarget.prepare(root, "x.mp4", overwrite=True)
    target.open_temp().write_bytes(b"video")
    target.commit()
    assert victim.read_bytes() == b"keep"
    assert (root / "x.mp4").read_bytes() == b"video" and not (root / "x.mp4").is_symlink()


def test_discard_removes_the_temp_file(tmp_path: Path) -> None:
    target = FileTarget.prepare(tmp_path, "x.mp4", overwrite=False)
    target.open_temp().write_bytes(b"partial")
    target.discard()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("relative", "container", "said"),
    [
        ("jobs/x", "mp4", "has no extension, which says what plays it: name it 'jobs/x.mp4'"),
        ("jobs/x", "webm", "name it 'jobs/x.webm'"),
        ("x.mp4", "webm", "ends in .mp4, but output.container is webm"),
        ("x.avi", "mp4", "ends in .avi, which no container writes"),
    ],
)
def test_a_name_that_does_not_say_its_container_is_refused(
    tmp_path: Path, relative: str, container: str, said: str
) -> None:
    with pytest.raises(InvalidRequest, match=r"^output\.file\.path: the path ") as info:
        FileTarget.prepare(tmp_path, relative, overwrite=False, container=container)
    assert said in str(info.value)
    assert not list(tmp_path.rglob("x*"))


def test_a_directory_in_the_way_is_said_before_the_name(tmp_path: Path) -> None:
    from sidecar.errors import OutputError

    (tmp_path / "taken").mkdir()
    with pytest.raises(OutputError, match="it is a directory"):
        FileTarget.prepare(tmp_path, "taken", overwrite=False)


@pytest.mark.parametrize(
    ("path", "container", "written"),
    [(None, "", "mp4"), (None, "webm", "webm"), ("a.webm", "", "webm"), ("a.mp4", "fmp4", "fmp4")],
)
def test_the_container_an_output_is_written_in(
    path: str | None, container: str, written: str
) -> None:
    from sidecar.pipeline.admission.requests import OutputRequest
    from sidecar.pipeline.output.files import output_container

    assert output_container(OutputRequest(path=path, container=container)) == written
