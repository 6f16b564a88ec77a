"""Private Evolution / PrE-Text (Hou et al., "PrE-Text: Training Language Models on Private
Federated Data in the Age of LLMs", arXiv:2406.02958): population draws (``draw``), the Variation
API (``variation``), Expand (``expand``)."""
