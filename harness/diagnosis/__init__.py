"""Root-cause diagnosis: turn "the engine differs from training" into one named cause and the
id list (or engine fix) that removes it. It words causes; it never decides pass/fail (that is
`harness.judgement.assertions`).

- `record`: the `Diagnosis` record, its kinds and the per-slot `SlotMatch`;
- `fingerprint`: the per-token error measure and what each engine slot holds;
- `evidence`: fitted models of what an engine did to its slots (precision, normalisation,
  partial sum, shift, swapped requests, layout, batch dependence) and, where none fits, what
  each slot was seen to hold;
- `capture`: naming the cause of an aux-capture mismatch, and its wording;
- `draft_side`: the kinds seen past the capture (fc, vocabulary map, draft cache);
- `decode`: the kinds seen in the draft's decode-time feeds and in request history;
- `crash`: reading a cause out of an engine's error message.
- `observed_convention`: the layer-id rule an engine was measured to apply over every
  config it was served, and whose drafts it therefore serves as trained (torch-free: the
  report renders it).
- `remedy`: which remedies are a change of the draft's config, the remedied copy to re-serve
  for a diagnosis, and the "verified" / "unverified: <why>" wording (torch-free: the report
  words every diagnosis' remedy with it).
"""
