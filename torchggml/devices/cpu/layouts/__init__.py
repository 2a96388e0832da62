"""The CPU_REPACK extra buffer types: one class per weight layout (base.py says what they share)."""
