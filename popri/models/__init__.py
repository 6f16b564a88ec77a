"""Models: ``llm`` (loading, GGUF aliases), ``embed`` (sentence-transformers with a cache), ``fid``
(Frechet distance), ``generation`` (the one LLM engine factory and sampler), ``lora`` (TRL / PEFT
plumbing shared by DPO and SFT)."""
