"""DeepSeek-V4 kernels written in pto.language; importing this package registers every
kernel module's ``KernelCase`` (docs/dsl.md)."""

from pto.models.deepseek_v4 import hc_post  # noqa: F401  (registers "hc_post")
from pto.models.deepseek_v4 import prefill_sparse_attn  # noqa: F401  (registers "prefill_sparse_attn")
from pto.models.deepseek_v4 import prefill_compressor_ratio128  # noqa: F401  (registers "prefill_compressor_ratio128")
from pto.models.deepseek_v4 import rms_norm  # noqa: F401  (registers "rms_norm")
from pto.models.deepseek_v4 import hc_pre  # noqa: F401  (registers "hc_pre")
from pto.models.deepseek_v4 import qkv_proj_rope  # noqa: F401  (registers "qkv_proj_rope")
from pto.models.deepseek_v4 import prefill_attention_swa  # noqa: F401  (registers "prefill_attention_swa")
from pto.models.deepseek_v4 import decode_sparse_attn  # noqa: F401  (registers "decode_sparse_attn_swa", "decode_sparse_attn_hca")
from pto.models.deepseek_v4 import lookup_embedding  # noqa: F401  (registers "lookup_embedding")
from pto.models.deepseek_v4 import prefill_compressor_ratio4  # noqa: F401  (registers "prefill_compressor_ratio4")
from pto.models.deepseek_v4 import decode_compressor_ratio4  # noqa: F401  (registers "decode_compressor_ratio4")
from pto.models.deepseek_v4 import gate  # noqa: F401  (registers "gate")
from pto.models.deepseek_v4 import decode_attention_swa  # noqa: F401  (registers "decode_attention_swa")
from pto.models.deepseek_v4 import prefill_indexer_compressor  # noqa: F401  (registers "prefill_indexer_compressor")
from pto.models.deepseek_v4 import decode_indexer_compressor  # noqa: F401  (registers "decode_indexer_compressor")
from pto.models.deepseek_v4 import expert_shared  # noqa: F401  (registers "expert_shared")
from pto.models.deepseek_v4 import decode_compressor_ratio128  # noqa: F401  (registers "decode_compressor_ratio128")
from pto.models.deepseek_v4 import decode_attention_hca  # noqa: F401  (registers "decode_attention_hca")
from pto.models.deepseek_v4 import prefill_indexer  # noqa: F401  (registers "prefill_indexer")
from pto.models.deepseek_v4 import decode_indexer  # noqa: F401  (registers "decode_indexer")
from pto.models.deepseek_v4 import expert_routed  # noqa: F401  (registers "expert_routed")
from pto.models.deepseek_v4 import prefill_attention_hca  # noqa: F401  (registers "prefill_attention_hca")
from pto.models.deepseek_v4 import moe  # noqa: F401  (registers "moe")
from pto.models.deepseek_v4 import hc_head  # noqa: F401  (registers "hc_head")
from pto.models.deepseek_v4 import prefill_attention_csa  # noqa: F401  (registers "prefill_attention_csa")
from pto.models.deepseek_v4 import decode_attention_csa  # noqa: F401  (registers "decode_attention_csa")
from pto.models.deepseek_v4 import lm_head  # noqa: F401  (registers "lm_head")
from pto.models.deepseek_v4 import sampling  # noqa: F401  (registers "greedy_sample")
from pto.models.deepseek_v4 import mtp_projection  # noqa: F401  (registers "mtp_projection")
from pto.models.deepseek_v4 import mtp_layer  # noqa: F401  (registers "mtp_layer")

# the model: checkpoints, the golden forward, the kernel path, generation
from pto.models.deepseek_v4.weights import open_checkpoint  # noqa: E402,F401
from pto.models.deepseek_v4.model import GoldenModel  # noqa: E402,F401
from pto.models.deepseek_v4.layer import KernelModel  # noqa: E402,F401
from pto.models.deepseek_v4.generate import GenerateResult, generate  # noqa: E402,F401
from pto.models.deepseek_v4 import graph_only  # noqa: E402,F401  (graph-only step builds; the routing assumption)
