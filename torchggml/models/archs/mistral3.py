"""mistral3 (Mistral Small 3.x / Ministral text models): llama's graph (with experts when the file
has them, and the query temperature of Llama 4 when attention.temperature_scale is set: Q of the
token at position p times 1 + scale * log(floor(p / n_ctx_orig) + 1)), with YaRN reading the
file's beta and log-multiplier keys.
"""
from __future__ import annotations

from .llama import Llama


class Mistral3(Llama):
    names = ("mistral3",)

    def read_hparams(self, hp, keys):
        hp.yarn_beta_fast = float(keys.get("rope.scaling.yarn_beta_fast", hp.yarn_beta_fast))
        hp.yarn_beta_slow = float(keys.get("rope.scaling.yarn_beta_slow", hp.yarn_beta_slow))
        hp.yarn_log_mul = float(keys.get("rope.scaling.yarn_log_multiplier", 0.0))
        hp.attn_temp_scale = float(keys.get("attention.temperature_scale", 0.0))


ARCHS = [Mistral3()]
