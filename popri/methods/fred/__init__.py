"""FreD (Hou et al., "Privately Customizing Prefinetuning to Better Match User Data in Federated
Learning", arXiv:2302.09042): private embedding statistics and the Frechet distance."""
