"""llama-quantize's file types by name, without importing torch (the command line lists them):
name -> (the id llama.cpp numbers it with, the name of its default block type). quantize.py
turns the block names into torchggml.types.Type."""
from __future__ import annotations

FILE_TYPE_IDS = {
    "F32": (0, "F32"), "F16": (1, "F16"), "BF16": (32, "BF16"),
    "Q4_0": (2, "Q4_0"), "Q4_1": (3, "Q4_1"), "Q5_0": (8, "Q5_0"), "Q5_1": (9, "Q5_1"), "Q8_0": (7, "Q8_0"),
    "Q2_K": (10, "Q2_K"), "Q3_K_S": (11, "Q3_K"), "Q3_K_M": (12, "Q3_K"), "Q3_K_L": (13, "Q3_K"),
    "Q4_K_S": (14, "Q4_K"), "Q4_K_M": (15, "Q4_K"), "Q5_K_S": (16, "Q5_K"), "Q5_K_M": (17, "Q5_K"),
    "Q6_K": (18, "Q6_K"), "IQ4_NL": (25, "IQ4_NL"), "IQ4_XS": (30, "IQ4_XS"), "Q2_K_S": (21, "Q2_K"),
    "IQ2_XXS": (19, "IQ2_XXS"), "IQ2_XS": (20, "IQ2_XS"), "IQ2_S": (28, "IQ2_XS"), "IQ2_M": (29, "IQ2_S"),
    "IQ1_S": (24, "IQ1_S"), "IQ1_M": (31, "IQ1_M"), "IQ3_XXS": (23, "IQ3_XXS"), "IQ3_XS": (22, "IQ3_S"),
    "IQ3_S": (26, "IQ3_S"), "IQ3_M": (27, "IQ3_S"),
}
# listed by llama-quantize as "alias for Q4_K_M" etc.: accepted, and said when used
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
CHOICES = ", ".join([*FILE_TYPE_IDS, *(f"{a} (alias for {t})" for a, t in ALIASES.items())])
