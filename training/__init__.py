"""Training of the embedded default voice (engine/assets/default): a small codec of the
modded-DAC family and a small DualAR model, from teacher data the project makes itself.
The commands that made the shipped voice, in order: training/recipe/README.md.

data:      corpus (Jane Austen sentences, Debian's r-cran-janeaustenr; rdata reads it),
           phonemes (espeak-ng), teacher (Piper via onnxruntime), speakers (pseudo-speakers),
           datagen (Ogg Opus shards + manifest), opus_io, resample, audio_data,
           phone_targets (the codec's CTC targets from the phonemes)
codec:     codec_forward (straight-through VQ, CTC phone head), codec_losses, codec_train (train/export/encode)
model:     lm_data (S2 prompt sequences), lm_forward (batched training forward, guided attention), lm_train
shared:    presets (the voice's shapes), schedule, checkpoints, export (checkpoint folder)
quality:   evaluate (pocketsphinx WER, speaker similarity, CPU speed)
kernel:    snake_train (the codec trainer's fused Snake: forward and backward, one Triton pass each)

Nothing in engine/, realtime/, kernels/ or clients/ imports this package, and the wheel does
not ship it; the `training` extra holds the packages only it needs.
"""
