"""Regression: EPModel gave request ``k`` to rank ``min(N - 1, k * N // max_requests)``, ``k``
counting every request the model ever made: two prompts in a deployment of 4 requests both went
to rank 0 (no data parallelism), and every request of a second ``generate`` call (``k >= 4``)
to the last rank (bench_ep's timed runs decoded all 4 requests on rank 1). Owners are now round
robin, ``k mod N``."""

from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.config import get_deployment
from pto.models.deepseek_v4.weights import open_checkpoint
from pto.runtime import distributed as dist


def test_owners_round_robin_across_generate_calls(tmp_path):
    from pto.models.deepseek_v4.ep_model import EPModel

    ck = write_tiny_checkpoint(tmp_path / "tiny", seed=1)
    dep = get_deployment("tiny").replace(max_context=32, rope_max_pos=32)

    def rank(r):
        model = EPModel(open_checkpoint(ck, "int8"), dep)
        owners = []
        for batch in (2, 4, 3):  # three generate calls' worth of requests, released in between
            states = [model.new_state() for _ in range(batch)]
            owners.append([model.owner(st) for st in states])
            for st in states:
                model.release_state(st)
        return owners

    assert dist.run_threads(rank, 2, timeout_s=60) == [[[0, 1], [0, 1, 0, 1], [0, 1, 0]]] * 2
