"""Fake SGLang runtime (``sglang.srt``): simulator only, standard library only."""
