"""The paged cache manager (issue 15: cache.py): pools, block tables, slot mappings, rings,
sliding-window page release, and CapacityError naming the exhausted cache."""

import pytest
import torch

from pto.errors import BindError, CapacityError
from pto.models.deepseek_v4.cache import Cache
from pto.models.deepseek_v4.config import get_config, get_deployment, kernel_config


@pytest.fixture
def cache():
    return Cache(get_config("tiny"), get_deployment("tiny"))


def test_layout(cache):
    cfg = get_config("tiny")
    csa = ["cmp_kv", "idx_kv", "idx_kv_scale", "idx_state", "kv", "state"]
    assert [sorted(t) for t in cache.layers] == [["kv"], ["kv"], csa, ["cmp_kv", "kv", "state"], csa,
                                                 ["cmp_kv", "kv", "state"]]
    # DeploymentConfig.sized: 4 requests x (ceil((63 + 128) / 16) + 1) raw pages, 4 x 32 HCA state pages
    assert cache.layers[0]["kv"].shape == (52, 16, 1, 128) and cache.layers[0]["kv"].dtype == torch.bfloat16
    assert cache.layers[2]["state"].shape == (136, 4, 512) and cache.layers[3]["state"].shape == (128, 8, 256)
    assert cache.layers[2]["idx_kv"].shape == (64, 16, 1, cfg.index_head_dim)
    assert cache.layers[2]["idx_kv"].dtype == torch.int8 and cache.layers[2]["idx_kv_scale"].shape == (64, 16, 1, 1)


def test_tables_and_slots(cache):
    a, b = cache.add_request(), cache.add_request()
    cache.reserve(a, 40)
    cache.reserve(b, 20)
    ta, tb = cache.block_table(a), cache.block_table(b)
    assert ta[:3].tolist() == [0, 1, 2] and tb[:2].tolist() == [3, 4] and int(ta[3]) == -1
    pos = torch.tensor([0, 17, 39])
    assert cache.slot_mapping(a, pos).tolist() == [0, 16 + 1, 32 + 7]
    # CSA entries: only window-closing positions (3, 7, ...) get a compressed row
    assert cache.slot_mapping(a, torch.tensor([2, 3, 39]), "csa_cmp").tolist() == [-1, 0, 9]
    assert cache.block_table(a, "csa_cmp")[:2].tolist() == [0, -1]  # 10 entries -> 1 page
    assert cache.slot_mapping(a, torch.tensor([0, 127]), "hca_cmp").tolist() == [-1, -1]  # not reserved
    # state rings: CSA one window per page, HCA two windows of 16 pages
    ring = cache.requests[a].rings["csa_state"]
    assert cache.slot_mapping(a, torch.tensor([5]), "csa_state").tolist() == [ring[1] * 4 + 1]
    st = cache.block_table(a, "hca_state")
    hring = cache.requests[a].rings["hca_state"]
    assert st[0] == hring[0] and st[16] == hring[16] and st[32] == hring[0] and len(set(st.tolist())) == 32


def test_sliding_window_pages_are_returned(cache):
    r = cache.add_request()
    free0 = cache.pools["swa_kv"].free_pages
    for _ in range(20):  # 20 chunks of 16 tokens: only the window's pages stay owned
        cache.reserve(r, 16)
        cache.commit(r, 16)
    owned = cache.requests[r].pages["swa_kv"]
    assert sorted(owned) == [16, 17, 18, 19]  # the next token (320) sees 257 .. 320
    assert cache.pools["swa_kv"].free_pages == free0 - 4
    cache.release(r)
    assert cache.pools["swa_kv"].free_pages == free0 and cache.pools["csa_state"].free_pages == 136


def test_exhausted_pools_name_the_cache():
    cfg, dep = get_config("tiny"), get_deployment("tiny")
    small = Cache(cfg, dep.replace(cmp_kv_block_num=2))
    r = small.add_request()
    small.reserve(r, 128)  # 32 CSA entries: 2 pages
    small.commit(r, 128)
    with pytest.raises(CapacityError, match="cache 'csa_cmp': request 0 needs 1 more page"):
        small.reserve(r, 4)  # entry 32 needs a third page
    # nothing half-allocated: the raw page of positions 128.. was not taken
    assert small.requests[r].pages["swa_kv"] == {b: b for b in range(4, 8)}
    c = Cache(cfg, dep)
    for _ in range(4):
        c.add_request()
    with pytest.raises(CapacityError, match="max_requests=4"):
        c.add_request()
    c2 = Cache(cfg, dep.replace(hca_state_block_num=40, max_requests=8))
    c2.add_request()
    with pytest.raises(CapacityError, match="cache 'hca_state'"):
        c2.add_request()
    assert c2.pools["csa_state"].free_pages == 136 - 34  # the failed request kept nothing
    with pytest.raises(CapacityError, match="max_context=1024"):
        c.reserve(0, 1025)
    with pytest.raises(BindError, match="no live request 9"):
        c.reserve(9, 1)


def test_kv_rows_and_kernel_config(cache):
    r = cache.add_request()
    cache.reserve(r, 3)
    cache.layers[1]["kv"][0, :3, 0, :] = torch.arange(3.0)[:, None]
    assert cache.kv_rows(1, r, torch.tensor([2, 0]))[:, 0].tolist() == [2.0, 0.0]
    with pytest.raises(BindError, match="no swa_kv page for position 40"):
        cache.kv_rows(1, r, torch.tensor([40]))
    k = kernel_config(get_config("tiny"), get_deployment("tiny"))
    assert (k.cmp_kv_block_num, k.hca_state_block_num, k.max_position_embeddings) == (64, 128, 1024)
