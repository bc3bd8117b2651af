"""Model constants shared by the mini kernels (a sibling module, as in pypto-lib)."""

HIDDEN = 256
EPS = 1e-6
DECODE_BATCH, DECODE_SEQ = 2, 4
PREFILL_BATCH, PREFILL_SEQ = 1, 20  # 20 tokens: the last 8-row tile has 4 valid rows
