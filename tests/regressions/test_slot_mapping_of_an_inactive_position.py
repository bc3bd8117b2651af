"""Cache.slot_mapping of position -1 (an inactive decode token of an S = 2 MTP step) was a real
row: the page index -1 wrapped to the table's last entry and the row to ``page - 1``, so the
inactive token would have written into the request's last page."""

import torch

from pto.models.deepseek_v4.cache import Cache
from pto.models.deepseek_v4.config import DeploymentConfig, get_config


def test_negative_positions_map_to_no_row():
    cfg = get_config("tiny")
    c = Cache(cfg, DeploymentConfig.sized(cfg, 1, 64, block_size=16))
    r = c.add_request()
    c.reserve(r, 64)  # every table entry owned, the last one too
    for kind in ("swa_kv", "csa_state", "hca_state", "csa_cmp", "hca_cmp"):
        rows = c.slot_mapping(r, torch.tensor([-1, -5, 3]), kind)
        assert rows[:2].tolist() == [-1, -1], kind
    assert c.slot_mapping(r, torch.tensor([3]), "swa_kv").tolist() == [3]
