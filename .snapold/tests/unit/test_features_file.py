"""features_file.FeatureFile: rows by input index, NaN where none came, both files in place only at commit."""

from __future__ import annotations

import numpy as np
import pytest

from inception_engine.errors import EngineError
from inception_engine.features_file import FeatureFile, check_features_path, names_path


def test_rows_land_at_their_indices_and_gaps_are_nan(tmp_path):
    path = tmp_path / "f.npy"
    f = FeatureFile(path, ["a.png", "b\nc.png", "d.png", "e.png", "f.png"], 4)
    f.add([0, 2], np.array([[1, 1, 1, 1], [3, 3, 3, 3]], np.float32))  # 1 failed
    f.add([], np.zeros((0, 4), np.float32))
    f.add([3], np.full((1, 4), 4, np.float32))  # 4 never comes
    assert not path.exists() and not names_path(path).exists()  # nothing in place before the commit
    f.commit()
    got = np.load(path)
    assert got.dtype == np.float32 and got.shape == (5, 4)
    np.testing.assert_array_equal(got[[0, 2, 3], 0], [1, 3, 4])
    assert np.isnan(got[[1, 4]]).all()
    assert names_path(path).read_bytes() == b"a.png\nb\\nc.png\nd.png\ne.png\nf.png\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.npy", "f.txt"]


def test_discard_leaves_nothing(tmp_path):
    f = FeatureFile(tmp_path / "f.npy", ["a"], 2)
    f.add([0], np.ones((1, 2), np.float32))
    f.discard()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name,words", [("f.csv", ".npy"), ("taken.npy", "exists already"),
                                        ("listed.npy", "listed.txt exists already")])
def test_check_features_path_refuses(tmp_path, name, words):
    (tmp_path / "taken.npy").write_bytes(b"")
    (tmp_path / "listed.txt").write_text("")
    with pytest.raises(EngineError, match=words):
        check_features_path(str(tmp_path / name))
