"""Rules by which published rows become estimate requests (cost_model.validation.published)."""

from cost_model.validation.published import PublishedCase, _case, _recompute, load_rows

LLAMA3_TEXT = "none at 8K sequence ('we could pre-train Llama 3 on sequences of 8K tokens without activation checkpointing'); not stated for 128K"


def test_a_recompute_stated_for_one_sequence_length_holds_only_there():
    assert _recompute(LLAMA3_TEXT, 8192) == "none"
    assert _recompute(LLAMA3_TEXT, 131072) is None
    assert _recompute("full (uniform, 1 layer)", 2048) == "full"
    assert _recompute(None, 2048) is None


def test_llama3_128k_row_searches_recompute_and_8k_rows_do_not():
    rows = {r["id"]: r for r in load_rows() if r["id"].startswith("llama3-405b")}
    long = _case(rows["llama3-405b-16384gpu-seq131072"])
    short = _case(rows["llama3-405b-16384gpu-seq8192"])
    assert isinstance(long, PublishedCase) and isinstance(short, PublishedCase)
    assert {s.recompute for s in short.candidates} == {"none"}
    assert {"none", "full"} <= {s.recompute for s in long.candidates}
    assert "recompute: best that fits" in long.assumptions


def test_a_model_parallel_size_alone_splits_as_its_authors_prescribe():
    """Narayanan 2021 Table 2 gives tp·pp only: tp over a node's 8 GPUs, the pipeline across
    nodes (the paper's Takeaway #1, which every layout of its Table 1 from 18B up follows)."""
    rows = {r["id"]: r for r in load_rows() if r["id"].startswith("narayanan21-t2-PTD-P")}
    for row_id, (tp, pp) in (("narayanan21-t2-PTD-P-174.6B-384gpu", (8, 12)), ("narayanan21-t2-PTD-P-529.6B-560gpu", (8, 35))):
        case = _case(rows[row_id])
        assert isinstance(case, PublishedCase)
        assert {(s.tp, s.pp) for s in case.candidates} == {(tp, pp)}
        assert any("Takeaway #1" in a for a in case.assumptions)
