"""FewFedPIT: federated few-shot instruction tuning with self-generated data
("FewFedPIT: Towards Privacy-preserving and Few-shot Federated Instruction Tuning",
arXiv:2403.06131): the filters (:mod:`.filters`), the instruction-following score
(:mod:`.ifs`) and the local aggregation sharing / server average (:mod:`.weights`)."""
