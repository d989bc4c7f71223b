"""Lab directories are root's own: a planted directory or one others may write is refused."""
import os

import pytest

from rlblab import workdir


def test_lab_dirs_are_private_and_a_planted_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(workdir, "BASE", tmp_path / "rlblab")
    d = workdir.lab_dir("rlbx")
    assert d.is_dir() and oct(d.stat().st_mode & 0o777) == "0o700"
    assert workdir.lab_dir("rlbx") == d                       # adopted when it is ours
    os.chmod(d, 0o777)
    with pytest.raises(workdir.LabDirError, match="only it may write"):
        workdir.lab_dir("rlbx")
    os.chmod(d, 0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(workdir.LabDirError, match="uid 65534"):
        workdir.lab_dir("rlbx")
    (tmp_path / "rlblab" / "link").symlink_to(tmp_path)
    with pytest.raises(workdir.LabDirError):
        workdir.lab_dir("link")
