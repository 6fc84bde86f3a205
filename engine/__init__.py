"""The Fish Speech DualAR engine: model, codec, tokenizer, prompts and generation."""
