"""The modded-DAC codec family: causal convolutions, residual VQ, streaming decode."""
