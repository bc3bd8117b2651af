"""decode_fwd / prefill_fwd allocated every layer's scratch in the program's top scope, so the
heap peak grew by one layer's scratch per layer (FLASH decode step 609.3 MiB, 128-token
prefill 9.4 GiB). Every layer and block now runs in its own heap scope: the peak is one
layer's scratch plus a few residual streams, with the same tasks and edges."""

import pytest

from pto.models.deepseek_v4.graph_only import decode_step_graph, prefill_graph


def test_decode_step_heap_peak_is_one_layer_not_the_sum():
    g = decode_step_graph("tiny")
    assert (g.stats.tasks, g.stats.edges) == (362, 539)  # unchanged by the scopes (f93f303: 3 expert tasks per MoE block more)
    # exact: the CSA layer's attention scratch plus the live streams (top scope: 3,569,152 B)
    assert g.stats.heap_peak_bytes == 815104
    peaks = {s.name: s.heap_peak_bytes for s in g.stages}
    assert max(peaks.values()) == peaks["L2 attention csa"] == peaks["L4 attention csa"]
    stream = 8 * 4 * 128 * 4  # x_layer [8 rows, hc_mult 4, D 128] FP32 of tiny
    # the head runs after every layer's scratch was freed: the last stream and its own scratch
    assert stream <= peaks["hc_head"] < 2 * stream


def test_prefill_heap_peak_is_one_layer_not_the_sum():
    g = prefill_graph("tiny", tokens=64)
    assert (g.stats.tasks, g.stats.edges) == (476, 855)
    assert g.stats.heap_peak_bytes == 5513216  # top scope: 28,379,648 B


@pytest.mark.slow
def test_flash_decode_step_heap_peak():
    g = decode_step_graph("flash")
    assert (g.stats.tasks, g.stats.edges) == (3216, 4675)
    assert g.stats.heap_peak_bytes == 20987904  # 20.0 MiB (top scope: 638,937,600 B, 609.3 MiB)
