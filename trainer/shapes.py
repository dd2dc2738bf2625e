"""Model shapes the trainer can build without a download (torch-free, so sweepkit may read them)."""

TINY_MODEL = "tiny-random"
RANDOM_PREFIX = "random:"

# Shapes of published checkpoints (their config.json), for random-init benchmarks.
RANDOM_SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": dict(architecture="qwen2", hidden_size=896, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                         vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(architecture="qwen2", hidden_size=1536, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
                         vocab_size=151936, tie_word_embeddings=True),
    "qwen3-1.7b": dict(architecture="qwen3", hidden_size=2048, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, intermediate_size=6144,
                       head_dim=128, vocab_size=151936, tie_word_embeddings=True),
}
TINY_SHAPE = dict(architecture="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True)
