"""DeepSeek-V4 kernels written in pto.language; importing this package registers every
kernel module's ``KernelCase`` (DESIGN section 8)."""

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
