"""Two models of one's own, benchmarked by attnbench beside its built-in ones (see README "Benchmark your own
model"): ``layers.GatedRecurrence`` (a recurrent layer) and ``layers.AlibiAttention`` (an attention layer)."""
