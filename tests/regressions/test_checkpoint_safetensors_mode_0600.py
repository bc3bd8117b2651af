"""Regression: ``pto checkpoint tiny`` wrote its safetensors files with mode 0600 (safetensors'
own default) while config.json got the usual 0644, so another user could read the config but
not the weights of a shared checkpoint. Every file now gets ``0666 & ~umask``.
"""

import os
import stat

from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint


def test_every_file_of_a_written_checkpoint_gets_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        write_tiny_checkpoint(tmp_path / "t", seed=0, shards=2)
    finally:
        os.umask(old)
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in (tmp_path / "t").iterdir()}
    assert len(modes) == 4  # config.json, the index and two shards
    assert set(modes.values()) == {0o644}, modes
