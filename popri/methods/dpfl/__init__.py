"""DP federated learning of the downstream model: DP-FedAvg and DP-FTRL (POPri appendix C)."""
