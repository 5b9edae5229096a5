"""REGRAB model components, one per file (encoder, graph prior, sampler, model)."""
