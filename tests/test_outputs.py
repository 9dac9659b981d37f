"""What the writers do to what is already there: an output never replaces a device, FIFO or socket, never makes
folders a dangling link points into, and a failed write leaves the previous file (tests of
:mod:`fmha_dsl.atomic_file`; the build directory's own guarantees are in test_registry_edges / test_build_triton)."""

import os
import stat

import pytest

from fmha_dsl.atomic_file import write_atomic
from fmha_dsl.errors import UsageError


def _refused(path, *fragments):
    with pytest.raises(UsageError) as e:
        write_atomic(path, "new")
    d = e.value.diagnostics[0]
    assert d.rule == "output.write" and d.hint
    for f in fragments:
        assert f in d.message, d.message


def test_a_fifo_or_a_link_to_a_device_is_never_replaced(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _refused(str(fifo), "it is a FIFO")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    link = tmp_path / "registry.json"
    link.symlink_to(os.devnull)
    _refused(str(link), f"through a link to `{os.devnull}`", "it is a device")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_a_dangling_link_into_a_missing_folder_makes_no_folder(tmp_path):
    link = tmp_path / "out.json"
    target = tmp_path / "missing" / "deeper" / "x.json"
    link.symlink_to(target)
    _refused(str(link), "whose folder does not exist")
    assert not (tmp_path / "missing").exists()
    (tmp_path / "missing" / "deeper").mkdir(parents=True)   # with the folder there, the link is written through
    write_atomic(str(link), "through")
    assert target.read_text() == "through" and link.is_symlink()


def test_a_regular_file_is_replaced_whole_and_a_new_path_gets_its_folders(tmp_path):
    f = tmp_path / "a" / "b" / "r.json"
    write_atomic(str(f), "one")
    os.chmod(f, 0o640)
    write_atomic(str(f), ["t", "wo"])
    assert f.read_text() == "two" and stat.S_IMODE(os.stat(f).st_mode) == 0o640
    assert sorted(os.listdir(f.parent)) == ["r.json"]   # no temp file left
