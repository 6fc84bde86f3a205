"""The Fish Speech DualAR engine: model, codec, tokenizer, prompts and generation."""

from engine.alignment import WordTiming  # what StreamSink.on_words receives (engine.engine re-exports it too)

__all__ = ["WordTiming"]
