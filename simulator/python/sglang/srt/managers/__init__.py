"""Child processes of the fake server (scheduler, detokenizer) and the tokenizer manager."""
