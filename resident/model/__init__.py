"""The Qwen3.5 text model: config, layers, step metadata, caches and weights."""
