"""POPri (Hou et al., "Private Federated Learning using Preference-Optimized Synthetic Data",
arXiv:2504.16438): preference pairs from DP client scores (``prefs``), DPO (``dpo``)."""
